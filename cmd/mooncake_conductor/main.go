// Command mooncake_conductor is the Conductor KV-cache indexer: it consumes KV cache events
// from vLLM, SGLang and the Mooncake Store master and answers prefix-hit queries over HTTP
// (msgpack) and RPC (coro_rpc). Configuration: CONDUCTOR_CONFIG_PATH (JSON, default
// $HOME/.mooncake/conductor_config.json) and CONDUCTOR_LOG_LEVEL (debug|info|warn|error).
package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/conductor-go/conductor/server"
)

func main() {
	os.Exit(run())
}

func run() int {
	// Installed first, so that a signal during start-up still means a clean exit 0.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	level, levelErr := parseLevel(os.Getenv("CONDUCTOR_LOG_LEVEL"))
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if levelErr != nil {
		log.Warn("invalid CONDUCTOR_LOG_LEVEL; using info", "value", os.Getenv("CONDUCTOR_LOG_LEVEL"))
	}
	path := configPath()
	cfg, err := server.LoadConfigFile(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mooncake_conductor: %v\n", err)
		log.Error("cannot load configuration", "path", path, "err", err)
		return 1
	}
	if !cfg.Found {
		log.Warn("config file not found; using defaults and no static services", "path", path)
	}
	for _, skipped := range cfg.Skipped {
		log.Error("invalid static service skipped", "path", path, "err", skipped)
	}
	appCfg := cfg.AppConfig()
	appCfg.Logger = log
	app, err := server.Start(appCfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mooncake_conductor: %v\n", err)
		return 1
	}
	s := <-sig
	log.Info("signal received; shutting down", "signal", s.String())
	app.Stop()
	return 0
}

// configPath follows upstream: CONDUCTOR_CONFIG_PATH, else $HOME/.mooncake/conductor_config.json.
func configPath() string {
	if p := os.Getenv("CONDUCTOR_CONFIG_PATH"); p != "" {
		return p
	}
	if home := os.Getenv("HOME"); home != "" {
		return home + "/.mooncake/conductor_config.json"
	}
	return "~/.mooncake/conductor_config.json"
}

func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "info":
		return slog.LevelInfo, nil
	case "debug":
		return slog.LevelDebug, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return slog.LevelInfo, fmt.Errorf("unknown log level %q", s)
}
