package tokensem_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeSnippetsCompile type-checks the Go snippets of README.md and
// docs/*.md: each becomes the body of a function in a throwaway package of
// this module, with the names a snippet takes as given (ctx, nc, train,
// ...) declared, and go vet must accept it. A snippet that no longer
// matches the API fails here, not in a reader's editor. Only blocks that
// start a line count (see goBlock).
func TestReadmeSnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a package")
	}
	docs, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	// Blocks at the start of a line only: one indented under a list item
	// (docs/new-backend.md's TestMain) is a declaration, not a body.
	goBlock := regexp.MustCompile("(?ms)^```go\n(.*?)^```")
	type snippet struct {
		file string
		body []byte
	}
	var snippets []snippet
	for _, file := range append([]string{"README.md"}, docs...) {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		found := goBlock.FindAllSubmatch(text, -1)
		if file == "README.md" && len(found) == 0 {
			t.Fatal("no Go snippets in README.md")
		}
		for _, m := range found {
			snippets = append(snippets, snippet{file, m[1]})
		}
	}
	dir, err := os.MkdirTemp(".", "readmecheck")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	var src strings.Builder
	src.WriteString(readmePrelude)
	for i, s := range snippets {
		fmt.Fprintf(&src, "\n// from %s\nfunc snippet%d() {\n", s.file, i)
		src.Write(s.body)
		src.WriteString("\n\tuse(err, sem, p, conn, rsem, nc, m, group, gate)\n}\n")
	}
	if err := os.WriteFile(filepath.Join(dir, "snippets.go"), []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "vet", "./"+dir).CombinedOutput()
	if err != nil {
		t.Fatalf("Go snippets of README.md or docs/*.md do not compile: %v\n%s", err, out)
	}
}

// readmePrelude declares what the snippets take as given. Names a snippet
// does not declare itself are blanked by use, so each snippet declares
// what it uses and nothing more.
const readmePrelude = `package readmecheck

import (
	"context"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/httpsem"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/semgroup"
	"github.com/tokensem/tokensem/semmetrics"
)

var (
	ctx     = context.Background()
	addr    = "127.0.0.1:8080"
	url     = nats.DefaultURL
	pass    string
	handler http.Handler
	sem     tokensem.Semaphore
	nc      *nats.Conn
	conn    *amqpsem.Conn
	err     error
	p, rsem, m, group, gate any
)

func train(ctx context.Context) error         { return nil }
func work(ctx context.Context) error          { return nil }
func serveCached(ctx context.Context) error   { return nil }
func use(...any)                              {}

var (
	_ = time.Second
	_ = prometheus.DefaultRegisterer
	_ = httpsem.New
	_ = semgroup.New
	_ = semmetrics.New
	_ = natssem.Open
	_ = adaptive.NewWindow
)
`
