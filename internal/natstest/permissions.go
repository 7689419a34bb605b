package natstest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tokensem/tokensem/natssem/embedded"
)

// RootUser may do anything; the role tests make the semaphores of other
// users with it.
const RootUser = "root"

// Password returns the password StartWithRoles gives user.
func Password(user string) string { return user + "-pw" }

// InboxPrefix returns the inbox prefix the documented permissions give
// user: _INBOX_<user>.
func InboxPrefix(user string) string { return "_INBOX_" + user }

// roleBlock matches a ```conf block of docs/permissions-nats.md whose first
// line is "# user: NAME ...".
var roleBlock = regexp.MustCompile("(?s)```conf\n(# user: ([A-Za-z0-9_]+)[^\n]*\n.*?)```")

// RoleBlocks returns the permission blocks of the document at path, by the
// user each is written for.
func RoleBlocks(path string) (map[string]string, error) {
	doc, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blocks := map[string]string{}
	for _, m := range roleBlock.FindAllSubmatch(doc, -1) {
		blocks[string(m[2])] = string(m[1])
	}
	if len(blocks) == 0 {
		return nil, fmt.Errorf("%s: no ```conf blocks starting with \"# user: NAME\"", path)
	}
	return blocks, nil
}

// StartWithRoles starts a standalone server with JetStream whose users are
// RootUser, with no limits, and one user per block, with exactly the
// block's permissions; each password is Password(user). The server's
// configuration is written to and parsed from a file in dir, as
// nats-server would read it.
func StartWithRoles(dir string, blocks map[string]string) (*embedded.Server, error) {
	var conf strings.Builder
	conf.WriteString("authorization: {\n  users: [\n")
	fmt.Fprintf(&conf, "    { user: %q, password: %q }\n", RootUser, Password(RootUser))
	for user, block := range blocks {
		fmt.Fprintf(&conf, "    {\n      user: %q, password: %q\n%s    }\n", user, Password(user), block)
	}
	conf.WriteString("  ]\n}\n")
	file := filepath.Join(dir, "nats-server.conf")
	if err := os.WriteFile(file, []byte(conf.String()), 0o600); err != nil {
		return nil, err
	}
	parsed, err := server.ProcessConfigFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", file, err, conf.String())
	}
	return embedded.Start(embedded.Config{Options: func(o *server.Options) error {
		o.Users = parsed.Users
		return nil
	}})
}
