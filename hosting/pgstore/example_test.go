package pgstore_test

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/pgstore"
)

func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "host=127.0.0.1 port=5432 user=frontdoor dbname=frontdoor sslmode=disable")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pgstore.Migrate(ctx, pool, ""); err != nil {
		panic(err)
	}
	var st hosting.Store = pgstore.New(pool, pgstore.Options{})
	_, _ = st.Find(ctx, hosting.Filter{ActiveAgentID: "agent-1"})
}
