package idem

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

type ctxKey string

// TestDeadlineCtxActsLikeWithDeadline drives deadlineCtx and
// context.WithDeadline through the same events and compares what each
// reports, with and without anyone having asked for Done first.
func TestDeadlineCtxActsLikeWithDeadline(t *testing.T) {
	cause := errors.New("client went away")
	tests := []struct {
		name string
		// end makes the context done: by deadline, by parent or by cancel.
		end     func(parentCancel context.CancelCauseFunc, cancel func())
		wait    time.Duration
		wantErr error
	}{
		{"deadline passes", func(context.CancelCauseFunc, func()) {}, 400 * time.Millisecond, context.DeadlineExceeded},
		{"parent cancelled", func(pc context.CancelCauseFunc, _ func()) { pc(cause) }, 0, context.Canceled},
		{"cancelled", func(_ context.CancelCauseFunc, c func()) { c() }, 0, context.Canceled},
	}
	for _, tt := range tests {
		for _, askDone := range []bool{false, true} {
			name := tt.name
			if askDone {
				name += "/Done asked first"
			}
			t.Run(name, func(t *testing.T) {
				// Far enough ahead that a loaded machine does not reach it while
				// the subjects are built and checked.
				deadline := time.Now().Add(250 * time.Millisecond)
				type subject struct {
					ctx    context.Context
					cancel func()
					pc     context.CancelCauseFunc
				}
				var lazy deadlineCtx
				lp, lpc := context.WithCancelCause(context.WithValue(context.Background(), ctxKey("k"), "v"))
				lazy.init(lp, deadline)
				rp, rpc := context.WithCancelCause(context.WithValue(context.Background(), ctxKey("k"), "v"))
				real, realCancel := context.WithDeadline(rp, deadline)
				subjects := map[string]subject{
					"deadlineCtx":  {&lazy, lazy.cancel, lpc},
					"WithDeadline": {real, realCancel, rpc},
				}
				for name, s := range subjects {
					if askDone {
						_ = s.ctx.Done()
					}
					if err := s.ctx.Err(); err != nil {
						t.Fatalf("%s: Err before the end = %v", name, err)
					}
					if d, ok := s.ctx.Deadline(); !ok || !d.Equal(deadline) {
						t.Fatalf("%s: Deadline = %v, %v", name, d, ok)
					}
					tt.end(s.pc, s.cancel)
				}
				time.Sleep(tt.wait)
				for name, s := range subjects {
					if err := s.ctx.Err(); !errors.Is(err, tt.wantErr) {
						t.Errorf("%s: Err = %v, want %v", name, err, tt.wantErr)
					}
					select {
					case <-s.ctx.Done():
					case <-time.After(time.Second):
						t.Errorf("%s: Done not closed", name)
					}
					if got := s.ctx.Value(ctxKey("k")); got != "v" {
						t.Errorf("%s: Value = %v", name, got)
					}
				}
				if got, want := context.Cause(&lazy), context.Cause(real); !errors.Is(got, want) {
					t.Errorf("Cause = %v, WithDeadline's = %v", got, want)
				}
				// A child and an AfterFunc registered after the end run at once.
				for name, s := range subjects {
					child, cancel := context.WithCancel(s.ctx)
					stopped := make(chan struct{})
					context.AfterFunc(s.ctx, func() { close(stopped) })
					select {
					case <-child.Done():
					case <-time.After(time.Second):
						t.Errorf("%s: child not done", name)
					}
					select {
					case <-stopped:
					case <-time.After(time.Second):
						t.Errorf("%s: AfterFunc did not run", name)
					}
					cancel()
				}
				lazy.cancel()
				realCancel()
			})
		}
	}
}

// TestDeadlineCtxEarlierParentDeadline: the parent's earlier deadline wins,
// as with WithDeadline.
func TestDeadlineCtxEarlierParentDeadline(t *testing.T) {
	early := time.Now().Add(time.Minute)
	parent, cancel := context.WithDeadline(context.Background(), early)
	defer cancel()
	var c deadlineCtx
	c.init(parent, early.Add(time.Hour))
	defer c.cancel()
	if d, _ := c.Deadline(); !d.Equal(early) {
		t.Fatalf("Deadline = %v, want the parent's %v", d, early)
	}
}

// TestDeadlineCtxDetached: a store context built on WithoutCancel outlives
// its request but not its own deadline.
func TestDeadlineCtxDetached(t *testing.T) {
	req, cancelReq := context.WithCancel(context.Background())
	var c deadlineCtx
	c.init(context.WithoutCancel(req), time.Now().Add(30*time.Millisecond))
	defer c.cancel()
	cancelReq()
	if err := c.Err(); err != nil {
		t.Fatalf("Err after the request was cancelled = %v, want nil", err)
	}
	select {
	case <-c.Done():
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Fatalf("Err = %v, want DeadlineExceeded", c.Err())
		}
	case <-time.After(time.Second):
		t.Fatal("Done never closed")
	}
}

// TestDeadlineCtxConcurrent races Done, Err, Value and cancel under -race:
// every goroutine must see the same end.
func TestDeadlineCtxConcurrent(t *testing.T) {
	for range 200 {
		var c deadlineCtx
		c.init(context.Background(), time.Now().Add(time.Hour))
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				switch i % 4 {
				case 0:
					<-c.Done()
				case 1:
					c.cancel()
					<-c.Done()
				case 2:
					for c.Err() == nil {
					}
				case 3:
					_ = c.Value(ctxKey("k"))
					<-c.Done()
				}
			})
		}
		wg.Wait()
		if !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("Err = %v, want Canceled", c.Err())
		}
	}
}

// TestDeadlineCtxArmsNoTimerUntilAsked: Err and Value before the deadline
// allocate nothing, which is the point of the type.
func TestDeadlineCtxArmsNoTimerUntilAsked(t *testing.T) {
	var c deadlineCtx
	parent := context.WithValue(context.Background(), ctxKey("k"), "v")
	allocs := testing.AllocsPerRun(100, func() {
		c = deadlineCtx{}
		c.init(parent, time.Now().Add(time.Hour))
		_ = c.Err()
		_ = c.Value(ctxKey("k"))
		c.cancel()
	})
	if allocs != 0 {
		t.Fatalf("%v allocations, want 0", allocs)
	}
	if c.real.Load() != nil {
		t.Fatal("a timer context was created without Done being asked")
	}
}
