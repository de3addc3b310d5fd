package main

import (
	"bytes"
	"context"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// flagsDoc is the reference of every command's flags and environment.
const flagsDoc = "../../docs/flags.md"

// documentedCommands are the commands docs/flags.md has a section for,
// each headed "## `COMMAND`"; limits is a group of commands, which its own
// --help lists.
var documentedCommands = []string{"serve", "check-config", "probe", "top", "limits", "migrate"}

var (
	helpFlag = regexp.MustCompile(`(?m)^  -([a-z][a-z0-9-]*)`)
	// envName is an environment variable's name: capitals and digits
	// joined by underscores.
	envName  = regexp.MustCompile(`\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b`)
	docFlag  = regexp.MustCompile("`--([a-z][a-z0-9-]*)")
	docCode  = regexp.MustCompile("`[^`]*`")
	anyFlags = regexp.MustCompile("(?:^|[\\s(\\[/`])--([a-z][a-z0-9-]*[a-z0-9])")
)

// notEnv are the capitalised names with underscores in --help that are
// protocol codes or placeholders of arguments, not environment variables.
var notEnv = []string{"ENHANCE_YOUR_CALM", "NOT_SERVING", "OVER_LIMIT", "RESOURCE_EXHAUSTED", "KEY_NAME"}

// notOurs are the flags the document may name that no command lists:
// --help, which every command takes; --pprof, removed, whose use is an
// error the document explains; Envoy's --concurrency.
var notOurs = []string{"help", "pprof", "concurrency"}

// TestFlagsDocumented: every flag and environment variable a command's
// --help names is in that command's tables of docs/flags.md exactly once,
// and the document names no flag or variable the command does not read.
func TestFlagsDocumented(t *testing.T) {
	doc, err := os.ReadFile(flagsDoc)
	if err != nil {
		t.Fatalf("reading the flags reference: %v", err)
	}
	sections := commandSections(string(doc))
	// Upstream's names the serve command reads besides those its help names.
	serveExtra := []string{"GRPC_SERVER_USE_TLS"}
	for _, a := range upstreamAliases {
		serveExtra = append(serveExtra, a.theirs)
	}
	for _, a := range upstreamTLS {
		serveExtra = append(serveExtra, a.theirs)
	}
	helps := map[string]map[string]string{} // section → command → its --help
	anyCommand := map[string]bool{}         // a section may name another command's flag (serve --check-addr)
	for _, cmd := range documentedCommands {
		helps[cmd] = map[string]string{cmd: help(t, cmd)}
		if cmd == "limits" {
			helps[cmd] = map[string]string{}
			for _, sub := range groupCommands(help(t, cmd)) {
				helps[cmd][sub] = help(t, cmd+" "+sub)
			}
		}
		for _, h := range helps[cmd] {
			for f := range set(helpFlag.FindAllStringSubmatch(h, -1), 1) {
				anyCommand[f] = true
			}
		}
	}
	for _, cmd := range documentedCommands {
		t.Run(cmd, func(t *testing.T) {
			help := strings.Join(slices.Collect(maps.Values(helps[cmd])), "\n")
			flags := set(helpFlag.FindAllStringSubmatch(help, -1), 1)
			envs := map[string]bool{}
			for _, e := range envName.FindAllString(help, -1) {
				if !slices.Contains(notEnv, e) {
					envs[e] = true
				}
			}
			if len(flags) == 0 || len(envs) == 0 {
				t.Fatalf("%s --help names no flag or no variable: the parsing is broken:\n%s", cmd, help)
			}
			known := map[string]bool{}
			for e := range envs {
				known[e] = true
			}
			if cmd == "serve" {
				for _, e := range serveExtra {
					known[e] = true
				}
			}

			sec, ok := sections[cmd]
			if !ok {
				t.Fatalf("%s has no section \"## `%s`\"", flagsDoc, cmd)
			}
			docFlags, docEnvs := tableNames(sec)
			for f := range flags {
				if n := docFlags[f]; n != 1 {
					t.Errorf("--%s is in %d rows of the `%s` tables of %s, want 1", f, n, cmd, flagsDoc)
				}
			}
			for e := range envs {
				if n := docEnvs[e]; n != 1 {
					t.Errorf("%s is in %d rows of the `%s` tables of %s, want 1", e, n, cmd, flagsDoc)
				}
			}
			for f := range docFlags {
				if !flags[f] {
					t.Errorf("%s documents --%s, which %s does not have", flagsDoc, f, cmd)
				}
			}
			for e := range docEnvs {
				if !known[e] {
					t.Errorf("%s documents %s for %s, which it does not read", flagsDoc, e, cmd)
				}
			}
			if len(helps[cmd]) > 1 {
				checkCommandsColumn(t, cmd, sec, helps[cmd])
			}
			// Prose too must not name a flag the command lacks.
			for _, m := range anyFlags.FindAllStringSubmatch(sec, -1) {
				if !anyCommand[m[1]] && !slices.Contains(notOurs, m[1]) {
					t.Errorf("%s names --%s in the `%s` section: no command has it", flagsDoc, m[1], cmd)
				}
			}
		})
	}
}

// help is the --help of the command line cmd.
func help(t *testing.T, cmd string) string {
	t.Helper()
	var out bytes.Buffer
	if err := run(context.Background(), append(strings.Fields(cmd), "--help"), func(string) string { return "" }, &out, &out); err != nil {
		t.Fatalf("%s --help: %v", cmd, err)
	}
	return out.String()
}

// groupCommands are the commands a group's --help lists under
// "Commands:": the lower-case words each line starts with ("owner set").
func groupCommands(help string) []string {
	_, list, _ := strings.Cut(help, "\nCommands:\n")
	var out []string
	for _, line := range strings.Split(list, "\n") {
		if !strings.HasPrefix(line, "  ") {
			break
		}
		var words []string
		for _, w := range strings.Fields(line) {
			if strings.ToLower(w) != w || !commandWord.MatchString(w) {
				break
			}
			words = append(words, w)
		}
		out = append(out, strings.Join(words, " "))
	}
	return out
}

var commandWord = regexp.MustCompile(`^[a-z]+$`)

// checkCommandsColumn checks a group's table: each flag's "commands" cell
// ("all", or the commands in backquotes) names exactly the commands whose
// --help has the flag.
func checkCommandsColumn(t *testing.T, group, section string, helps map[string]string) {
	t.Helper()
	col := -1
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if col < 0 {
			col = slices.IndexFunc(cells, func(c string) bool { return strings.TrimSpace(c) == "commands" })
			continue
		}
		m := docFlag.FindStringSubmatch(cells[0])
		if m == nil || len(cells) <= col {
			continue
		}
		var want []string
		for sub, h := range helps {
			if set(helpFlag.FindAllStringSubmatch(h, -1), 1)[m[1]] {
				want = append(want, sub)
			}
		}
		var got []string
		if strings.TrimSpace(cells[col]) == "all" {
			got = slices.Collect(maps.Keys(helps))
		}
		for _, c := range docCode.FindAllString(cells[col], -1) {
			got = append(got, strings.Trim(c, "`"))
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s: the `%s` row of --%s names the commands %q; their --help says %q", flagsDoc, group, m[1], got, want)
		}
	}
	if col < 0 {
		t.Errorf("%s: the `%s` section has no table with a commands column", flagsDoc, group)
	}
}

// commandSections splits the document at its "## `COMMAND`" headings.
func commandSections(doc string) map[string]string {
	out := map[string]string{}
	cmd := ""
	for _, line := range strings.SplitAfter(doc, "\n") {
		if strings.HasPrefix(line, "## ") {
			cmd = ""
			h := strings.TrimSpace(strings.TrimPrefix(line, "## "))
			if strings.HasPrefix(h, "`") && strings.HasSuffix(h, "`") {
				cmd = strings.Trim(h, "`")
			}
		}
		if cmd != "" {
			out[cmd] += line
		}
	}
	return out
}

// tableNames counts, over the section's table rows, the rows naming each
// flag (in the first cell) and each variable (in a cell between the first
// and the last, which is the free-text meaning).
func tableNames(section string) (flags, envs map[string]int) {
	flags, envs = map[string]int{}, map[string]int{}
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "|---") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 3 {
			continue
		}
		for f := range set(docFlag.FindAllStringSubmatch(cells[0], -1), 1) {
			flags[f]++
		}
		rowEnvs := map[string]bool{}
		for _, c := range cells[1 : len(cells)-1] {
			for _, code := range docCode.FindAllString(c, -1) {
				for _, e := range envName.FindAllString(code, -1) {
					rowEnvs[e] = true
				}
			}
		}
		for e := range rowEnvs {
			envs[e]++
		}
	}
	return flags, envs
}

func set(matches [][]string, group int) map[string]bool {
	out := map[string]bool{}
	for _, m := range matches {
		out[m[group]] = true
	}
	return out
}
