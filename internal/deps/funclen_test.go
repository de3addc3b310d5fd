package deps_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines is the most lines a function of the server may span, its
// declaration and closing brace included: what one screen shows, so that
// a function is read whole.
const maxFuncLines = 80

// TestFunctionsFitOnAScreen: no function or method of internal/ or cmd/
// outside tests spans more than maxFuncLines lines.
func TestFunctionsFitOnAScreen(t *testing.T) {
	fset := token.NewFileSet()
	n := 0
	for _, dir := range []string{"../../internal", "../../cmd"} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			for _, decl := range f.Decls {
				fd, ok := decl.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				n++
				if lines := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; lines > maxFuncLines {
					t.Errorf("%s: %s spans %d lines, more than %d: split it", fset.Position(fd.Pos()), fd.Name.Name, lines, maxFuncLines)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if n < 1000 {
		t.Fatalf("read %d functions: the walk missed the source tree", n)
	}
}
