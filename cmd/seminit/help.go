package main

import (
	"flag"
	"fmt"
	"io"
	"maps"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/tokensem/tokensem/internal/redact"
)

// helpErr asks for a verb's help (-h or --help after the verb).
type helpErr struct{ fs *flag.FlagSet }

func (helpErr) Error() string { return "help requested" }

// verbHelp prints one verb's synopsis, from the usage text, and its flags
// with their defaults.
func verbHelp(w io.Writer, verb string, fs *flag.FlagSet) {
	fmt.Fprintln(w, "Usage:")
	lines := strings.Split(usage, "\n")
	for i, l := range lines {
		if l == "  seminit "+verb || strings.HasPrefix(l, "  seminit "+verb+" ") {
			fmt.Fprintln(w, l)
			for _, more := range lines[i+1:] {
				if !strings.HasPrefix(more, "         ") {
					break
				}
				fmt.Fprintln(w, more)
			}
		}
	}
	fmt.Fprintln(w, "\nFlags:")
	fs.VisitAll(func(f *flag.Flag) {
		typ, text := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if typ != "" {
			line += " " + typ
		}
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "0s" && f.DefValue != "false" &&
			!strings.Contains(text, "(default") {
			text += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		// A default from the environment ($TOKENSEM_URL) may hold
		// credentials.
		fmt.Fprintf(w, "%s\n      %s\n", line, redact.Text(text))
	})
	fmt.Fprintln(w, "\nseminit --help shows every verb, the URL and credential rules and the exit codes.")
}

// suggest returns the verb closest to an unknown one, for a hint.
func suggest(unknown string) string {
	return closest(unknown, slices.Sorted(maps.Keys(commands)))
}

// suggestFlag returns the flag of fs closest to an unknown one, for a
// hint.
func suggestFlag(fs *flag.FlagSet, unknown string) string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return closest(unknown, names)
}

// closest returns the candidate that starts with unknown or differs from
// it in at most two letters (the nearest), or "".
func closest(unknown string, candidates []string) string {
	best, bestDist := "", 3
	for _, c := range candidates {
		if strings.HasPrefix(c, unknown) && len(unknown) >= 2 {
			return c
		}
		if d := editDistance(unknown, c); d < bestDist {
			best, bestDist = c, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// version is seminit's version from the build information: the module
// version for go install, else the VCS revision the binary was built from.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "+dirty"
			}
		}
	}
	if (v == "" || v == "(devel)") && rev != "" {
		v = rev[:min(12, len(rev))] + modified
	}
	if v == "" {
		v = "(devel)"
	}
	return v + " (" + bi.GoVersion + ")"
}
