package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// runCompletion prints a completion script for bash, zsh or fish: verbs,
// then each verb's flags. Load it with, for bash,
// source <(seminit completion bash). It is not in commands, whose verbs
// it reads.
func runCompletion(e env, args []string) error {
	if len(args) != 1 {
		return usageErr{fmt.Errorf("want one shell: seminit completion bash|zsh|fish")}
	}
	verbs := slices.Sorted(maps.Keys(commands))
	flags := make(map[string][]string, len(verbs))
	for _, v := range verbs {
		flags[v] = flagsOf(v)
	}
	verbs = append(verbs, "completion")
	switch args[0] {
	case "bash":
		writeBash(e.stdout, verbs, flags)
	case "zsh":
		writeZsh(e.stdout, verbs, flags)
	case "fish":
		writeFish(e.stdout, verbs, flags)
	default:
		return usageErr{fmt.Errorf("completion %q: want bash, zsh or fish", args[0])}
	}
	return nil
}

// flagsOf returns a verb's flags ("--name", ...), from the flag set its
// --help hands back before it touches a broker.
func flagsOf(verb string) []string {
	err := commands[verb].run(context.Background(), env{stdout: io.Discard, stderr: io.Discard}, []string{"--help"})
	var he helpErr
	if !errors.As(err, &he) {
		return nil
	}
	var fs []string
	he.fs.VisitAll(func(f *flag.Flag) { fs = append(fs, "--"+f.Name) })
	return fs
}

// wordsAfter is what completes after verb v: its flags, or the shells
// after completion.
func wordsAfter(v string, flags map[string][]string) []string {
	if v == "completion" {
		return []string{"bash", "zsh", "fish"}
	}
	return flags[v]
}

func writeBash(w io.Writer, verbs []string, flags map[string][]string) {
	fmt.Fprintf(w, `# seminit completion for bash: source <(seminit completion bash)
_seminit() {
	local cur=${COMP_WORDS[COMP_CWORD]} i
	for ((i = 2; i < COMP_CWORD; i++)); do
		[[ ${COMP_WORDS[i]} == -- ]] && return # the command exec runs
	done
	if ((COMP_CWORD == 1)); then
		COMPREPLY=($(compgen -W "%s help" -- "$cur"))
		return
	fi
	case ${COMP_WORDS[1]} in
`, strings.Join(verbs, " "))
	for _, v := range verbs {
		words := wordsAfter(v, flags)
		fmt.Fprintf(w, "\t%s) COMPREPLY=($(compgen -W %q -- \"$cur\")) ;;\n", v, strings.Join(words, " "))
	}
	fmt.Fprintf(w, "\thelp) COMPREPLY=($(compgen -W %q -- \"$cur\")) ;;\n\tesac\n}\ncomplete -o default -F _seminit seminit\n", strings.Join(verbs, " "))
}

func writeZsh(w io.Writer, verbs []string, flags map[string][]string) {
	fmt.Fprintf(w, "#compdef seminit\n# seminit completion for zsh: source <(seminit completion zsh)\n_seminit() {\n\tif ((CURRENT == 2)); then\n\t\tcompadd -- %s help\n\t\treturn\n\tfi\n\t(( ${words[(I)--]} > 1 && ${words[(I)--]} < CURRENT )) && { _normal; return }\n\tcase $words[2] in\n", strings.Join(verbs, " "))
	for _, v := range verbs {
		words := wordsAfter(v, flags)
		fmt.Fprintf(w, "\t%s) compadd -- %s ;;\n", v, strings.Join(words, " "))
	}
	fmt.Fprintf(w, "\thelp) compadd -- %s ;;\n\tesac\n}\ncompdef _seminit seminit\n", strings.Join(verbs, " "))
}

func writeFish(w io.Writer, verbs []string, flags map[string][]string) {
	fmt.Fprintln(w, "# seminit completion for fish: seminit completion fish | source")
	fmt.Fprintf(w, "complete -c seminit -f -n __fish_use_subcommand -a '%s help'\n", strings.Join(verbs, " "))
	fmt.Fprintln(w, "complete -c seminit -f -n '__fish_seen_subcommand_from completion' -a 'bash zsh fish'")
	fmt.Fprintf(w, "complete -c seminit -f -n '__fish_seen_subcommand_from help' -a '%s'\n", strings.Join(verbs, " "))
	for _, v := range verbs {
		for _, f := range flags[v] {
			fmt.Fprintf(w, "complete -c seminit -n '__fish_seen_subcommand_from %s' -l %s\n", v, strings.TrimPrefix(f, "--"))
		}
	}
}
