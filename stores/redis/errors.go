package idemredis

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/idemgo/idem/core/idemstore"
	"github.com/redis/go-redis/v9"
)

// ErrNotReplicated is returned (wrapped with idemstore.ErrTransient) by Claim
// when WithWaitReplicas is set and fewer replicas than asked acknowledged
// the claim in time. The claim has been released again, so the client's
// retry claims afresh.
var ErrNotReplicated = errors.New("idemredis: the claim was not acknowledged by enough replicas in time")

// ErrCorruptRecord is returned when a key the store owns holds something
// the store did not write (another program uses the prefix).
var ErrCorruptRecord = errors.New("idemredis: malformed record")

// wrap wraps err once, as every idem store does: "idemredis: op: …", with
// idemstore.ErrTransient or idem.ErrMisconfigured when the error says so.
// errors.As still reaches go-redis's own error.
func wrap(op string, err error) error {
	return idemstore.WrapStoreError("idemredis", op, classify(err), err)
}

// transientPrefixes are server errors a retry gets past: the server is
// loading its data set, busy with a script, failing over, out of memory
// (an eviction may free some), or a Cluster slot is moving.
var transientPrefixes = []string{
	"LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY",
	"NOREPLICAS", "OOM", "MOVED", "ASK", "NOSCRIPT", "max number of clients",
}

// misconfiguredPrefixes are server errors no retry fixes: a permission the
// user lacks, a key of the wrong type under the store's prefix, keys in two
// Cluster slots, a server too old for a command or a script.
var misconfiguredPrefixes = []string{
	"NOPERM", "NOAUTH", "WRONGPASS", "WRONGTYPE", "CROSSSLOT",
	"unknown command", "Error running script", "ERR Error running script",
	"This Redis command is not allowed from script",
}

// classify tells transient errors (lost or refused connections, timeouts,
// the server errors above) from misconfigurations. A context the caller
// cancelled is neither: the caller gave up.
func classify(err error) idemstore.ErrorClass {
	switch {
	case err == nil, errors.Is(err, context.Canceled):
		return idemstore.ClassOther
	case errors.Is(err, ErrCorruptRecord):
		return idemstore.ClassMisconfigured
	case errors.Is(err, ErrNotReplicated), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrPoolExhausted):
		return idemstore.ClassTransient
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		for _, p := range misconfiguredPrefixes {
			if strings.HasPrefix(msg, p) || strings.HasPrefix(strings.TrimPrefix(msg, "ERR "), p) {
				return idemstore.ClassMisconfigured
			}
		}
		for _, p := range transientPrefixes {
			if strings.HasPrefix(msg, p) || strings.HasPrefix(strings.TrimPrefix(msg, "ERR "), p) {
				return idemstore.ClassTransient
			}
		}
		return idemstore.ClassOther
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) {
		return idemstore.ClassTransient
	}
	return idemstore.ClassOther
}
