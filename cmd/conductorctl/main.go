// Command conductorctl is the operator CLI for a conductor's HTTP API: register and
// unregister publishers, list services and the global view, ask how much of a prompt is
// cached, and watch all of it refresh.
//
//	conductorctl [--addr http://127.0.0.1:13333] [--json] [--timeout 5s] <command> [flags]
//
// Exit status: 0 on success, 1 when the conductor answers with an error, 2 for bad
// usage or input and when the conductor cannot be reached.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/conductor-go/conductor/httpclient"
)

const (
	exitOK    = 0
	exitReply = 1 // the conductor answered with an error, or an unreadable body
	exitUsage = 2 // bad flags or input, or the conductor could not be reached
)

const defaultAddr = "http://127.0.0.1:13333"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	c := &cli{ctx: ctx, stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, clearScreen: isTerminal(os.Stdout)}
	code := c.run(os.Args[1:])
	stop()
	os.Exit(code)
}

// run is the whole CLI behind main, for tests: stdin is os.Stdin and watch never clears
// the screen.
func run(args []string, stdout, stderr io.Writer) int {
	c := &cli{ctx: context.Background(), stdin: os.Stdin, stdout: stdout, stderr: stderr}
	return c.run(args)
}

// cli carries what a command may touch, so commands are testable without a process.
type cli struct {
	ctx            context.Context
	stdin          io.Reader
	stdout, stderr io.Writer
	// clearScreen makes watch redraw in place; only sensible on a terminal.
	clearScreen bool
}

// globals are the flags accepted before the command and, for convenience, after it.
type globals struct {
	addr    string
	json    bool
	timeout time.Duration
	token   string
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.addr, "addr", g.addr, "conductor HTTP address (http://host:port; host:port and host also work)")
	fs.BoolVar(&g.json, "json", g.json, "print the decoded response as JSON")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "limit for each request")
	fs.StringVar(&g.token, "token", g.token, "admin token for register/unregister (default $CONDUCTOR_ADMIN_TOKEN)")
}

// commandHelp documents the commands, in the order usage lists them. It is an array so
// that nothing can append to it.
var commandHelp = [...]struct{ name, args, summary string }{
	{"register", "(--file svc.json | --endpoint E --type T --model M --instance I --block-size N ...)", "register a KV event publisher"},
	{"unregister", "--instance I [--tenant T] [--dp-rank N] [--lora L]", "unregister a publisher (or one LoRA adapter of it)"},
	{"services", "", "list registered publishers"},
	{"view", "", "show the global view of indexed contexts"},
	{"query", "--model M --block-size N (--tokens 1,2,3 | --tokens-file F | -) [...]", "show cached prefix hits for a prompt"},
	{"watch", "[--interval 2s] [--count N] [--model M --block-size N --tokens-file F]", "refresh contexts, services and probe hits"},
	{"snapshot", "save|load --file F (- for stdout/stdin)", "save the index to a file, or load a saved one into a conductor"},
}

// dispatch runs the command name, if there is one of that name.
func (c *cli) dispatch(name string, g *globals, args []string) (int, bool) {
	cmd, ok := map[string]func(*globals, []string) int{
		"register": c.cmdRegister, "unregister": c.cmdUnregister, "services": c.cmdServices,
		"view": c.cmdView, "query": c.cmdQuery, "watch": c.cmdWatch, "snapshot": c.cmdSnapshot,
	}[name]
	if !ok {
		return 0, false
	}
	return cmd(g, args), true
}

func (c *cli) usage(w io.Writer) {
	fmt.Fprintf(w, "usage: conductorctl [--addr %s] [--json] [--timeout 5s] <command> [flags]\n\ncommands:\n", defaultAddr)
	for _, cmd := range commandHelp {
		fmt.Fprintf(w, "  %-11s %s\n", cmd.name, cmd.summary)
	}
	fmt.Fprintln(w, "\nRun 'conductorctl <command> -h' for the flags of a command.")
	fmt.Fprintln(w, "Exit status: 0 ok, 1 error reply from the conductor, 2 bad usage or conductor unreachable.")
}

func (c *cli) run(args []string) int {
	g := &globals{addr: defaultAddr, timeout: httpclient.DefaultTimeout, token: os.Getenv("CONDUCTOR_ADMIN_TOKEN")}
	fs := flag.NewFlagSet("conductorctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	g.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.usage(c.stdout)
			return exitOK
		}
		fmt.Fprintf(c.stderr, "error: %v\n", err)
		c.usage(c.stderr)
		return exitUsage
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(c.stderr, "error: no command given")
		c.usage(c.stderr)
		return exitUsage
	}
	name := fs.Arg(0)
	if name == "help" {
		c.usage(c.stdout)
		return exitOK
	}
	if code, ok := c.dispatch(name, g, fs.Args()[1:]); ok {
		return code
	}
	fmt.Fprintf(c.stderr, "error: unknown command %q\n", name)
	c.usage(c.stderr)
	return exitUsage
}

// parseFlags parses a command's flags, adding the global ones. It returns -1 to go on,
// or the exit status when parsing ended the command (help, or a bad flag).
func (c *cli) parseFlags(cmd string, fs *flag.FlagSet, g *globals, args []string) int {
	g.register(fs)
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.commandUsage(c.stdout, cmd, fs)
			return exitOK
		}
		return c.usageError(cmd, fs, err.Error())
	}
	return -1
}

func (c *cli) commandUsage(w io.Writer, name string, fs *flag.FlagSet) {
	for _, cmd := range commandHelp {
		if cmd.name == name {
			fmt.Fprintf(w, "usage: conductorctl %s %s\n\n%s.\n\nflags:\n", cmd.name, cmd.args, cmd.summary)
		}
	}
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// usageError reports a bad invocation of cmd with its usage, and returns exitUsage.
func (c *cli) usageError(cmd string, fs *flag.FlagSet, msg string) int {
	fmt.Fprintf(c.stderr, "error: %s: %s\n", cmd, msg)
	c.commandUsage(c.stderr, cmd, fs)
	return exitUsage
}

// inputError reports bad input that is not a flag problem (an unreadable file, say).
func (c *cli) inputError(err error) int {
	fmt.Fprintf(c.stderr, "error: %v\n", err)
	return exitUsage
}

func (c *cli) client(g *globals) (*httpclient.Client, int) {
	cl, err := httpclient.New(g.addr, httpclient.Options{Timeout: g.timeout, AdminToken: g.token})
	if err != nil {
		fmt.Fprintf(c.stderr, "error: --addr: %v\n", err)
		return nil, exitUsage
	}
	return cl, -1
}

// callError prints a failed call the way the contract's error body reads and maps it to
// the exit status.
func (c *cli) callError(err error) int {
	fmt.Fprintf(c.stderr, "error: %v\n", err)
	return exitCode(err)
}

func exitCode(err error) int {
	var ce *httpclient.ConnError
	if errors.As(err, &ce) {
		return exitUsage
	}
	return exitReply
}

func (c *cli) printJSON(v any) int {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintf(c.stderr, "error: encode JSON: %v\n", err)
		return exitReply
	}
	return exitOK
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
