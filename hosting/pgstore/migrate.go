package pgstore

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vipkit/vipkit/hosting"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// ErrMigration means a migration failed, or the database holds a migration this
// build does not know or whose checksum differs from the file's.
var ErrMigration = errors.New("pgstore: migration")

// Migration is one versioned migration, V<version>__<name>.sql.
type Migration struct {
	Version string // "1.0.14"
	Name    string
	SQL     string
	Sum     string // hex SHA-256 of SQL
	parts   []int
}

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	ents, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, e := range ents {
		m, err := parseName(e.Name())
		if err != nil {
			return nil, err
		}
		b, err := migrationFS.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, err
		}
		m.SQL = string(b)
		sum := sha256.Sum256(b)
		m.Sum = hex.EncodeToString(sum[:])
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Migration) int { return slices.Compare(a.parts, b.parts) })
	return out, nil
}

func parseName(n string) (Migration, error) {
	rest, ok := strings.CutPrefix(n, "V")
	rest, ok2 := strings.CutSuffix(rest, ".sql")
	ver, name, ok3 := strings.Cut(rest, "__")
	if !ok || !ok2 || !ok3 || name == "" {
		return Migration{}, fmt.Errorf("%w: bad file name %q", ErrMigration, n)
	}
	m := Migration{Version: ver, Name: name}
	for _, p := range strings.Split(ver, ".") {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 {
			return Migration{}, fmt.Errorf("%w: bad version in %q", ErrMigration, n)
		}
		m.parts = append(m.parts, v)
	}
	return m, nil
}

// Migrate applies the migrations up to and including version to ("" for
// all), each in its own transaction under an advisory lock, and records
// them in schema_migrations. Applied migrations are checked against the
// files: a changed checksum or an unknown applied version is ErrMigration,
// and nothing is applied.
func Migrate(ctx context.Context, pool *pgxpool.Pool, to string) error {
	ms, err := Migrations()
	if err != nil {
		return err
	}
	if to != "" && !slices.ContainsFunc(ms, func(m Migration) bool { return m.Version == to }) {
		return fmt.Errorf("%w: unknown version %s", ErrMigration, to)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", hosting.ErrStore, err)
	}
	defer conn.Release()
	// A session lock: two processes never migrate at once.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(7140014)"); err != nil {
		return fmt.Errorf("%w: %w", hosting.ErrStore, err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(7140014)") //nolint:errcheck
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version text PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("%w: %w", hosting.ErrStore, err)
	}
	rows, err := conn.Query(ctx, "SELECT version, checksum FROM schema_migrations")
	if err != nil {
		return fmt.Errorf("%w: %w", hosting.ErrStore, err)
	}
	applied := map[string]string{}
	for rows.Next() {
		var v, sum string
		if err := rows.Scan(&v, &sum); err != nil {
			rows.Close()
			return fmt.Errorf("%w: %w", hosting.ErrStore, err)
		}
		applied[v] = sum
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%w: %w", hosting.ErrStore, err)
	}
	known := map[string]Migration{}
	for _, m := range ms {
		known[m.Version] = m
	}
	for v, sum := range applied {
		m, ok := known[v]
		if !ok {
			return fmt.Errorf("%w: database has version %s, which this build does not know", ErrMigration, v)
		}
		if m.Sum != sum {
			return fmt.Errorf("%w: version %s was changed after it was applied (checksum %s, file %s)", ErrMigration, v, sum, m.Sum)
		}
	}
	for _, m := range ms {
		if _, done := applied[m.Version]; !done {
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, m.SQL); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)", m.Version, m.Name, m.Sum)
				return err
			})
			if err != nil {
				return fmt.Errorf("%w: V%s__%s: %w", ErrMigration, m.Version, m.Name, err)
			}
		}
		if m.Version == to {
			break
		}
	}
	return nil
}
