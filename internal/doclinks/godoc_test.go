package doclinks

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxPackageDoc is the most lines a package comment may take: about a
// screen of `go doc`, with the exported names below it. What a package
// provides, its invariants and its failure mode fit; the design reasoning
// goes in docs/design/, linked from the comment.
const maxPackageDoc = 40

// longDocs are the packages whose comment may still be longer, each with
// the reason and the work that shortens it. The test fails when one is no
// longer needed.
var longDocs = map[string]string{}

// TestPackageDocsFitAScreen: every package of the module has a package
// comment, of at most maxPackageDoc lines.
func TestPackageDocsFitAScreen(t *testing.T) {
	checked := 0
	usedLong := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "node_modules") {
			return filepath.SkipDir
		}
		lines, pkg, ok, err := packageDoc(path)
		if err != nil || pkg == "" {
			return err
		}
		checked++
		switch {
		case !ok:
			t.Errorf("%s: package %s has no package comment", rel(path), pkg)
		case lines > maxPackageDoc && longDocs[rel(path)] != "":
			usedLong[rel(path)] = true
		case lines > maxPackageDoc:
			t.Errorf("%s: the comment of package %s is %d lines, more than %d: keep what it provides, its invariants and its failure mode, and move the reasoning to docs/design/", rel(path), pkg, lines, maxPackageDoc)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 40 {
		t.Fatalf("only %d packages found: the walk is broken", checked)
	}
	for dir, why := range longDocs {
		if !usedLong[dir] {
			t.Errorf("%s: its package comment fits now: remove it from longDocs (it was: %s)", dir, why)
		}
	}
}

// packageDoc reads the non-test Go files of dir: the package name ("" for
// none), whether one has a package comment, and the longest one's lines.
func packageDoc(dir string) (lines int, pkg string, ok bool, err error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, "", false, err
	}
	fset := token.NewFileSet()
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return 0, "", false, err
		}
		pkg = f.Name.Name
		if f.Doc != nil {
			ok = true
			lines = max(lines, fset.Position(f.Doc.End()).Line-fset.Position(f.Doc.Pos()).Line+1)
		}
	}
	return lines, pkg, ok, nil
}
