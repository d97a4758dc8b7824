package tsng

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"

	"github.com/vipkit/vipkit/internal/buildinfo"
)

// RunDaemon loads the config file and runs the agent until ctx ends or the
// process gets SIGINT or SIGTERM. SIGHUP reloads the config file
// (Daemon.Reload). Logs are structured (log/slog) on stderr.
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
	// SIGHUP would end the process: it is taken from the start, and a
	// reload waits until the agent runs.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	d, err := NewDaemon(ctx, cfg, DaemonOptions{Logger: log, ConfigPath: configPath})
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		reloadOnSignal(ctx, d, hup, log)
	}()
	defer wg.Wait()
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

// reloadOnSignal reloads d's config on each signal from hup until ctx
// ends, and logs what the reload did or why it was refused.
func reloadOnSignal(ctx context.Context, d *Daemon, hup <-chan os.Signal, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		log.Info("SIGHUP: reloading the config")
		res, err := d.Reload(ctx)
		if err != nil {
			log.Error("reload refused; the running config stays", "err", err)
			continue
		}
		if res.Note != "" {
			log.Warn("reload: " + res.Note)
		}
	}
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
