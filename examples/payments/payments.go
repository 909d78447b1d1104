package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	idem "github.com/idemgo/idem/core"
)

// Payment is one payment, as stored and as rendered in JSON. Account is the
// principal that created it and is never rendered.
type Payment struct {
	ID          string    `json:"id" gorm:"primaryKey;size:40"`
	Account     string    `json:"-" gorm:"size:64;not null;index:payments_account_created,priority:1"`
	Amount      int64     `json:"amount" gorm:"not null"`
	Currency    string    `json:"currency" gorm:"size:3;not null"`
	Description string    `json:"description" gorm:"size:1000;not null"`
	Status      string    `json:"status" gorm:"size:16;not null"`
	CreatedAt   time.Time `json:"created_at" gorm:"precision:6;not null;index:payments_account_created,priority:2"`
}

// Repository keeps payments. Insert must write through the idempotency
// transaction that ctx carries, so the payment commits together with the
// stored response or not at all; it fails when ctx carries none.
type Repository interface {
	Insert(ctx context.Context, p Payment) error
	// List returns account's payments, oldest first.
	List(ctx context.Context, account string) ([]Payment, error)
	// Get returns account's payment id, or errNoPayment.
	Get(ctx context.Context, account, id string) (Payment, error)
}

var (
	errNoPayment = errors.New("payment not found")
	errNoTx      = errors.New("no idempotency transaction in the request context")
)

// Reply is a framework-neutral HTTP response; each framework file writes it
// in its own idiom.
type Reply struct {
	Status int
	Header http.Header
	Body   []byte
}

// SimulateHeader carries a failure drill when the service runs with
// -simulate-failures.
const SimulateHeader = "X-Simulate-Failure"

// Service is the payments logic, written once for every framework and
// store: validation, the insert through the idempotency transaction, list
// and get. Framework files only route, authenticate and mount the
// idempotency middleware in front of Create.
type Service struct {
	Repo Repository
	// Delay is slept after the payment row is written (-handler-delay).
	Delay time.Duration
	// SimulateFailures honours SimulateHeader.
	SimulateFailures bool
	Log              *slog.Logger
	// Provider, when set (-provider-url), charges every payment before
	// its row is written.
	Provider *providerClient
}

// ProblemBase prefixes the problem types of the example's own errors.
const ProblemBase = "https://github.com/idemgo/idem/blob/main/examples/payments/README.md#"

var currencyRE = regexp.MustCompile(`^[A-Z]{3}$`)

const maxDescription = 1000

// createRequest is the body of POST /payments. Amount is kept raw so that
// "100", 1.5 or 1e3 are refused rather than silently converted.
type createRequest struct {
	Amount      json.RawMessage `json:"amount"`
	Currency    *string         `json:"currency"`
	Description *string         `json:"description"`
}

// Create handles POST /payments for account. ctx must be the context the
// idempotency middleware handed the handler: it carries the transaction the
// payment is written in. simulate is the SimulateHeader value.
func (s *Service) Create(ctx context.Context, account string, body []byte, simulate string) Reply {
	p, msg := parseCreate(body)
	if msg != "" {
		// A deterministic client error: the middleware stores it as
		// failed and replays it to every retry with this key.
		return problem(http.StatusBadRequest, ProblemBase+"invalid-payment", "Invalid payment", msg)
	}
	p.ID, p.Account, p.Status = newPaymentID(), account, "succeeded"
	p.CreatedAt = time.Now().UTC().Truncate(time.Microsecond)
	if s.Provider != nil {
		// The provider's key is the same for every attempt at this
		// payment, the one after a crash included: it charges once.
		key, err := idem.DownstreamKey(ctx, chargeStep)
		if err != nil {
			s.Log.ErrorContext(ctx, "payment: no downstream key", slog.String("error", err.Error()))
			if errors.Is(err, idem.ErrNoAttempt) {
				return InternalError() // not behind the middleware: a bug
			}
			// The claim could not be made durable (the database is
			// unreachable or slow): nothing was charged, the key is
			// released, and the retry really retries.
			return problem(http.StatusServiceUnavailable, ProblemBase+"storage-unavailable", "Payment not stored",
				"The payment could not be recorded before charging. Nothing was charged; retrying with the same key is safe.")
		}
		c, err := s.Provider.Charge(ctx, key, p)
		if err != nil {
			s.Log.ErrorContext(ctx, "payment: charge failed", slog.String("error", err.Error()))
			return problem(http.StatusServiceUnavailable, ProblemBase+"provider-unavailable", "Payment provider unavailable",
				"The payment provider did not confirm the charge; nothing was stored. Retrying with the same key is safe: the provider charges a payment once.")
		}
		p = paymentOf(c)
	}
	// undo removes the row again when the request fails after writing it.
	// A store's transaction does that with a rollback; a keyedRepository
	// (-store redis: no shared transaction) does it with Undo.
	undo := func() {}
	var err error
	if kr, ok := s.Repo.(keyedRepository); ok {
		var inserted bool
		if p, inserted, err = kr.InsertOnce(ctx, p); err == nil && inserted {
			undo = func() {
				if err := kr.Undo(ctx, p); err != nil {
					// The row stays; the retry's InsertOnce finds it by its
					// downstream key and answers from it: still one payment.
					s.Log.ErrorContext(ctx, "payment undo failed", slog.String("error", err.Error()))
				}
			}
			defer func() {
				if v := recover(); v != nil {
					undo()
					panic(v)
				}
			}()
		}
	} else {
		err = s.Repo.Insert(ctx, p)
	}
	if errors.Is(err, errKeyReused) {
		return Reply(*idem.NewProblem(idem.ProblemKeyReused).Response(0))
	}
	if err != nil {
		s.Log.ErrorContext(ctx, "payment insert failed", slog.String("error", err.Error()))
		// 5xx: released, not stored; the retry really retries.
		return problem(http.StatusServiceUnavailable, ProblemBase+"storage-unavailable", "Payment not stored",
			"The payment could not be stored. Nothing was charged; retrying with the same key is safe.")
	}
	if s.Delay > 0 {
		t := time.NewTimer(s.Delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			undo()
			// Past the request deadline the engine rolls back and
			// releases whatever is returned here.
			return problem(http.StatusServiceUnavailable, ProblemBase+"timeout", "Request timed out",
				"The payment did not finish within the request timeout and was rolled back; retrying is safe.")
		}
	}
	if s.SimulateFailures {
		switch strings.ToLower(strings.TrimSpace(simulate)) {
		case "transient":
			undo()
			return problem(http.StatusServiceUnavailable, ProblemBase+"simulated-outage", "Payment provider unavailable",
				"Simulated dependency outage: the payment was rolled back; retrying with the same key is safe.")
		case "panic":
			panic("payments: simulated panic after the payment row was written")
		}
	}
	return createdReply(p)
}

// List handles GET /payments: account's payments, oldest first.
func (s *Service) List(ctx context.Context, account string) Reply {
	ps, err := s.Repo.List(ctx, account)
	if err != nil {
		s.Log.ErrorContext(ctx, "payment list failed", slog.String("error", err.Error()))
		return problem(http.StatusServiceUnavailable, ProblemBase+"storage-unavailable", "Payments unavailable",
			"The payments could not be read. Retry later.")
	}
	if ps == nil {
		ps = []Payment{}
	}
	return jsonReply(http.StatusOK, struct {
		Payments []Payment `json:"payments"`
	}{ps})
}

// Get handles GET /payments/{id}. Another account's payment is 404, as is
// one that does not exist.
func (s *Service) Get(ctx context.Context, account, id string) Reply {
	p, err := s.Repo.Get(ctx, account, id)
	switch {
	case errors.Is(err, errNoPayment):
		return problem(http.StatusNotFound, ProblemBase+"payment-not-found", "Payment not found",
			"No payment with this id exists for your account.")
	case err != nil:
		s.Log.ErrorContext(ctx, "payment get failed", slog.String("error", err.Error()))
		return problem(http.StatusServiceUnavailable, ProblemBase+"storage-unavailable", "Payment unavailable",
			"The payment could not be read. Retry later.")
	}
	return jsonReply(http.StatusOK, p)
}

// Health handles GET /healthz.
func (s *Service) Health() Reply {
	return jsonReply(http.StatusOK, map[string]string{"status": "ok"})
}

// parseCreate validates a POST /payments body. It returns a message for
// the 400 problem when the body is not a valid payment.
func parseCreate(body []byte) (Payment, string) {
	var req createRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return Payment{}, "The body must be a JSON object {\"amount\": <int > 0>, \"currency\": \"<ISO 4217 code>\", \"description\": \"<optional>\"}: " + err.Error() + "."
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Payment{}, "The body must hold exactly one JSON object."
	}
	var p Payment
	if req.Amount == nil {
		return p, "amount is required."
	}
	amount, err := strconv.ParseInt(string(req.Amount), 10, 64)
	if err != nil || amount <= 0 {
		return p, fmt.Sprintf("amount must be a positive integer (minor units), got %s.", req.Amount)
	}
	if req.Currency == nil || !currencyRE.MatchString(*req.Currency) {
		return p, "currency must be three upper-case letters, such as EUR."
	}
	if req.Description != nil {
		if len(*req.Description) > maxDescription {
			return p, fmt.Sprintf("description must be at most %d bytes.", maxDescription)
		}
		p.Description = *req.Description
	}
	p.Amount, p.Currency = amount, *req.Currency
	return p, ""
}

func newPaymentID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "pay_" + hex.EncodeToString(b[:])
}

// createdReply is the 201 of POST /payments for p.
func createdReply(p Payment) Reply {
	r := jsonReply(http.StatusCreated, p)
	r.Header.Set("Location", "/payments/"+p.ID)
	return r
}

func jsonReply(status int, v any) Reply {
	body, err := json.Marshal(v)
	if err != nil {
		return problem(http.StatusInternalServerError, ProblemBase+"internal", "Internal error", "")
	}
	return Reply{Status: status, Header: http.Header{"Content-Type": {"application/json"}}, Body: append(body, '\n')}
}

func problem(status int, typ, title, detail string) Reply {
	r := idem.Problem{Type: idem.ProblemType(typ), Title: title, Status: status, Detail: detail}.Response(0)
	return Reply{Status: r.Status, Header: r.Header, Body: r.Body}
}

// accountRE is what a bearer token must look like: the token is the
// account, and the account is the idempotency principal.
var accountRE = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)

// Authenticate returns the account of an Authorization header value
// "Bearer <account>", or "" when the header is missing or malformed.
func Authenticate(authorization string) string {
	scheme, token, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || !accountRE.MatchString(token) {
		return ""
	}
	return token
}

// Unauthorized is the 401 problem for a missing or malformed bearer token.
func Unauthorized() Reply {
	r := problem(http.StatusUnauthorized, string(idem.ProblemUnauthenticated), "Not authenticated",
		"Send Authorization: Bearer <account>, where <account> is 1 to 64 of a-z, 0-9, _ and -.")
	r.Header.Set("WWW-Authenticate", `Bearer realm="payments"`)
	return r
}

// InternalError is the reply of the recovery middleware after a panic.
func InternalError() Reply {
	return problem(http.StatusInternalServerError, ProblemBase+"internal", "Internal error",
		"The request failed and was rolled back; retrying with the same key is safe.")
}

// writeReply writes r to a net/http ResponseWriter (net/http, Gin and Echo
// all hand handlers one).
func writeReply(w http.ResponseWriter, r Reply) {
	for k, v := range r.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(r.Status)
	_, _ = w.Write(r.Body)
}
