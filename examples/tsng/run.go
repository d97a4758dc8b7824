package tsng

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/vipkit/vipkit/internal/buildinfo"
)

// RunDaemon loads the config file and runs the agent until ctx ends or the
// process gets SIGINT or SIGTERM. Logs are structured (log/slog) on stderr.
func RunDaemon(ctx context.Context, configPath string) error {
	return RunDaemonLog(ctx, configPath, os.Stderr)
}

// RunDaemonLog is RunDaemon logging to w.
func RunDaemonLog(ctx context.Context, configPath string, w io.Writer) error {
	cfg, err := LoadConfig(configPath)
	if err != nil {
		return err
	}
	level := slog.LevelInfo
	if cfg.LogLevel != "" {
		if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
			return err
		}
	}
	log := slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
	for _, warn := range cfg.Warnings() {
		log.Warn("config: " + warn)
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	d, err := NewDaemon(ctx, cfg, DaemonOptions{Logger: log})
	if err != nil {
		return err
	}
	sock := cfg.Socket
	if sock == "" {
		sock = DefaultSocket
	}
	ui := d.UIAddr()
	if ui == "" {
		ui = "off"
	}
	metrics := d.MetricsAddr()
	if metrics == "" {
		metrics = "off"
	}
	log.Info("tsng running", "version", buildinfo.Read().String(), "networks", len(cfg.Networks), "socket", sock,
		"ui", ui, "metrics", metrics, "data_dir", cfg.DataDir)
	<-ctx.Done()
	log.Info("tsng stopping")
	return d.Close()
}

// DefaultEnv is the environment of the real command.
func DefaultEnv() *Env {
	return &Env{Stdout: os.Stdout, Stderr: os.Stderr, Stdin: os.Stdin, Getenv: os.Getenv, Daemon: RunDaemon, Demo: Demo,
		OpenBrowser: func(url string) error {
			if os.Getenv("DISPLAY") == "" && os.Getenv("WAYLAND_DISPLAY") == "" {
				return nil // no desktop: the printed address is the answer
			}
			return exec.Command("xdg-open", url).Start()
		}}
}
