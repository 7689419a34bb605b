package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCompletionBash loads `seminit completion bash` into a real bash and
// completes with it: verbs, a verb's flags, nothing after exec's "--".
func TestCompletionBash(t *testing.T) {
	var script, stderr bytes.Buffer
	if code := run(t.Context(), nil, []string{"completion", "bash"}, &script, &stderr); code != exitOK {
		t.Fatalf("completion bash: exit %d: %s", code, stderr.String())
	}
	complete := func(words ...string) string {
		t.Helper()
		cmd := exec.Command("bash", "--norc", "--noprofile", "-c", script.String()+`
COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _seminit; echo "${COMPREPLY[*]}"`, "bash")
		cmd.Args = append(cmd.Args, words...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("bash: %v: %s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if got := complete("seminit", "ex"); got != "exec" {
		t.Errorf("seminit ex<TAB> = %q, want exec", got)
	}
	if got := complete("seminit", "exec", "--init"); got != "--init-permits" {
		t.Errorf("seminit exec --init<TAB> = %q, want --init-permits", got)
	}
	if got := complete("seminit", "completion", ""); got != "bash zsh fish" {
		t.Errorf("seminit completion <TAB> = %q", got)
	}
	if got := complete("seminit", "exec", "--name", "x", "--", "--na"); got != "" {
		t.Errorf("completing the command after exec's --: %q, want seminit's flags kept out", got)
	}
}

// TestCompletionZshFish loads the zsh and fish scripts into those shells:
// fish completes with it; zsh defines the completion function (zsh can
// only complete at a terminal).
func TestCompletionZshFish(t *testing.T) {
	for _, tc := range []struct{ shell, check, want string }{
		{"fish", `source $argv[1]; complete -C "seminit exec --init"; complete -C "seminit re"`, "--init-permits\nreconcile\nresize"},
		{"zsh", `autoload -Uz compinit && compinit -u && source $1 && print -r -- ${+functions[_seminit]}`, "1"},
	} {
		t.Run(tc.shell, func(t *testing.T) {
			if _, err := exec.LookPath(tc.shell); err != nil {
				if os.Getenv("CI") == "true" {
					t.Fatalf("CI=true and no %s (.ci/run installs it)", tc.shell)
				}
				t.Skipf("no %s here", tc.shell)
			}
			var out, stderr bytes.Buffer
			if code := run(t.Context(), nil, []string{"completion", tc.shell}, &out, &stderr); code != exitOK {
				t.Fatalf("completion %s: exit %d: %s", tc.shell, code, stderr.String())
			}
			file := filepath.Join(t.TempDir(), "seminit."+tc.shell)
			if err := os.WriteFile(file, out.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(tc.shell, "-c", tc.check, tc.shell, file)
			if tc.shell == "fish" {
				cmd = exec.Command("fish", "--no-config", "-c", tc.check, file)
			}
			cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "ZDOTDIR="+t.TempDir())
			got, err := cmd.CombinedOutput()
			if err != nil || strings.TrimSpace(string(got)) != tc.want {
				t.Fatalf("%s with the script: %v\n%s\nwant %q", tc.shell, err, got, tc.want)
			}
		})
	}
}
