// Package redisrefuse classifies the errors of go-redis calls for the Redis
// and Redlock drivers: a reply that refuses the request as invalid, and a
// peer that does not speak Redis's protocol at all. Both are configuration
// errors (driver.ErrInvalidArgument), never outages.
package redisrefuse

import (
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// refusals are the prefixes of Redis error replies that refuse the request
// or the connection's settings as such: retrying cannot help. Replies of a
// server that is busy, loading, read-only, out of memory or failing over
// (BUSY, LOADING, READONLY, OOM, MASTERDOWN, CLUSTERDOWN, TRYAGAIN, "max
// number of clients") are not among them: they are outages.
var refusals = []string{
	"WRONGPASS", "NOAUTH", "NOPERM",
	"ERR DB index is out of range",
	"ERR invalid DB index",
	"ERR invalid expire time",
	"ERR value is not an integer or out of range",
	"ERR syntax error",
	"ERR invalid password",
	"ERR AUTH",
	"ERR Client sent AUTH, but no password is set",
}

// Refused reports whether err is a Redis error reply that refuses the
// request as invalid (bad credentials, no permission, a database number
// out of range, an invalid argument).
func Refused(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	for _, p := range refusals {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// notRedisSigns are the texts of go-redis's reply-parsing errors: the peer
// answered, but with bytes that are not RESP (an HTTP server's
// "HTTP/1.1 400 Bad Request", dlockd's HTTP/2 frames, ...). go-redis gives
// them no type or sentinel of their own, so they are matched by message.
var notRedisSigns = []string{"redis: invalid reply", "redis: can't parse"}

// NotRedis reports whether err says the peer answered but does not speak
// Redis's protocol (RESP): the URL points at another kind of server. A
// Redis error reply (redis.Error) is never such an error.
func NotRedis(err error) bool {
	if err == nil {
		return false
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return false
	}
	msg := err.Error()
	for _, s := range notRedisSigns {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
