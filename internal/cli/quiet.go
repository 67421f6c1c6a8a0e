package cli

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// go-redis logs dial failures through a process-wide logger; the CLI reports
// them itself (exit 69 with the error), so its own log lines are noise.
type quietRedisLogger struct{}

func (quietRedisLogger) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(quietRedisLogger{}) }
