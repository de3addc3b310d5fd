package main

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// docCommand is one command line a reader is shown: where, and its text.
type docCommand struct {
	where string // file:line, or "COMMAND --help"
	text  string
}

var (
	fence     = regexp.MustCompile("^\\s*```\\s*([a-z]*)\\s*$")
	shellLang = []string{"sh", "bash", "shell", "console"}
	// ourCall is a call of the server's binary and its arguments up to the
	// end of the command (a comment, a pipe, a list, a substitution's end).
	// Words are one space apart: two end it (a help line's description).
	ourCall   = regexp.MustCompile(`(?:^|[\s$(])(?:\./)?(?:bin/)?ratelimit-authz((?: [^\s#|;&)]+)*)`)
	makeCall  = regexp.MustCompile(`(?:^|[\s;&(])make ([a-z][a-z0-9-]*)`)
	scriptArg = regexp.MustCompile(`(?:^|[\s$(])(scripts/[A-Za-z0-9_./-]+)`)
)

// documentedLines are the README's and docs' shell-block lines (a line
// continued with \ joined to the next) and inline code spans, and every
// line of each command's --help.
func documentedLines(t *testing.T) []docCommand {
	t.Helper()
	var out []docCommand
	files := []string{"../../README.md"}
	err := filepath.WalkDir("../../docs", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(f, "../../")
		inBlock, shell, pending := false, false, ""
		// A paragraph's code spans may break across its lines.
		var para []string
		paraAt := ""
		flush := func() {
			for _, span := range docCode.FindAllString(strings.Join(para, " "), -1) {
				out = append(out, docCommand{paraAt, strings.Trim(span, "`")})
			}
			para = nil
		}
		for i, line := range strings.Split(string(b), "\n") {
			where := name + ":" + strconv.Itoa(i+1)
			if m := fence.FindStringSubmatch(line); m != nil {
				flush()
				inBlock = !inBlock
				shell = inBlock && slices.Contains(shellLang, m[1])
				continue
			}
			switch {
			case inBlock && shell:
				if l, cont := strings.CutSuffix(line, `\`); cont {
					pending += l + " "
					continue
				}
				out = append(out, docCommand{where, pending + line})
				pending = ""
			case !inBlock && strings.TrimSpace(line) == "":
				flush()
			case !inBlock:
				if para == nil {
					paraAt = where
				}
				para = append(para, strings.TrimSpace(line))
			}
		}
		flush()
	}
	for _, cmd := range append(slices.Clone(documentedCommands), "") {
		for _, line := range strings.Split(help(t, cmd), "\n") {
			out = append(out, docCommand{strings.TrimSpace("ratelimit-authz " + cmd + " --help"), line})
		}
	}
	return out
}

// placeholder: a word the reader replaces (FILE, TENANT, …, [flags]) or a
// path of their own system.
func placeholder(w string) bool {
	return strings.ContainsAny(w, "…[]<>$'\"") || w == "COMMAND" || w == "ARGS" ||
		(strings.ToUpper(w) == w && strings.ToLower(w) != w && !strings.Contains(w, "/")) ||
		strings.HasPrefix(w, "/") || strings.Contains(w, "=/")
}

// TestDocumentedCommandsRun: every call of ratelimit-authz that the README,
// docs/ or a command's --help shows names a command that exists and only
// flags that command takes; each one that needs nothing the reader must
// supply (no placeholder, no database, no server running) and that only
// reads (check-config, version, help, --help) runs as written from a
// fresh clone's root and exits 0. Every make target named exists in the
// Makefile, and every script named exists and is executable.
func TestDocumentedCommandsRun(t *testing.T) {
	lines := documentedLines(t)
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	helps := map[string]string{}
	flagsOf := func(cmd string) []string {
		h, ok := helps[cmd]
		if !ok {
			h = help(t, cmd)
			helps[cmd] = h
		}
		var out []string
		for _, m := range helpFlag.FindAllStringSubmatch(h, -1) {
			out = append(out, m[1])
		}
		return out
	}
	var limitsCmds []string // set, …, owner set, …
	for _, c := range groupCommands(help(t, "limits")) {
		w := strings.Fields(c)
		if w[0] == "owner" {
			w[0] += " " + w[1]
		}
		limitsCmds = append(limitsCmds, w[0])
	}
	commands := append(slices.Clone(documentedCommands), "version", "help")
	t.Chdir("../..") // as the docs run them: from the clone's root
	var ran, checked int
	for _, l := range lines {
		for _, m := range ourCall.FindAllStringSubmatch(l.text, -1) {
			words := strings.Fields(m[1])
			if len(words) == 0 {
				continue
			}
			if !slices.Contains(commands, words[0]) {
				if !strings.HasPrefix(words[0], "-") && !placeholder(words[0]) && strings.ToLower(words[0]) == words[0] && len(words) > 1 && strings.HasPrefix(words[1], "-") {
					t.Errorf("%s: %q: no command %q", l.where, l.text, words[0])
				}
				continue
			}
			cmd := words[0]
			if cmd == "limits" && len(words) > 1 && !placeholder(words[1]) && !strings.HasPrefix(words[1], "-") {
				sub := words[1]
				if sub == "owner" && len(words) > 2 {
					sub += " " + words[2]
				}
				if !slices.Contains(limitsCmds, sub) {
					t.Errorf("%s: %q: limits has no command %q", l.where, l.text, sub)
					continue
				}
				cmd = "limits " + sub
			}
			checked++
			concrete := true
			for _, w := range words[1:] {
				if placeholder(w) {
					concrete = false
				}
				// A path into the clone must exist; another path is the
				// reader's own file.
				if p := strings.TrimPrefix(w, "./"); !strings.HasPrefix(w, "-") && (strings.Contains(p, "/") || filepath.Ext(p) == ".yaml") {
					top, _, _ := strings.Cut(p, "/")
					if _, err := os.Stat(top); err != nil || top == p {
						concrete = false
					} else if _, err := os.Stat(p); err != nil {
						t.Errorf("%s: %q: %s: %v", l.where, l.text, p, err)
					}
				}
				name, isFlag := strings.CutPrefix(strings.Trim(w, "[]"), "--")
				if !isFlag || cmd == "help" {
					continue
				}
				name, _, _ = strings.Cut(name, "=")
				if name != "help" && !slices.Contains(flagsOf(cmd), name) {
					t.Errorf("%s: %q: %s has no flag --%s", l.where, l.text, cmd, name)
				}
			}
			readOnly := cmd == "check-config" || cmd == "version" || cmd == "help" || slices.Contains(words, "--help")
			if !concrete || !readOnly {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			var out bytes.Buffer
			err := run(ctx, words, env(nil), &out, &out)
			cancel()
			ran++
			t.Logf("%s: ran %q", l.where, strings.Join(words, " "))
			if err != nil {
				t.Errorf("%s: %q: %v\n%s", l.where, l.text, err, out.String())
			}
		}
		for _, m := range makeCall.FindAllStringSubmatch(l.text, -1) {
			if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(m[1]) + `:`).Match(makefile) {
				t.Errorf("%s: %q: the Makefile has no target %s", l.where, l.text, m[1])
			}
		}
		for _, m := range scriptArg.FindAllStringSubmatch(l.text, -1) {
			if st, err := os.Stat(m[1]); err != nil || st.Mode()&0o111 == 0 {
				t.Errorf("%s: %q: %s is not an executable script (%v)", l.where, l.text, m[1], err)
			}
		}
	}
	t.Logf("%d calls of ratelimit-authz checked against their commands' flags, %d run as written", checked, ran)
	if checked < 20 || ran < 3 {
		t.Errorf("only %d calls found, %d run: the extraction is broken", checked, ran)
	}
}
