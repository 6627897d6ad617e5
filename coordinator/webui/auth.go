package webui

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/berthci/berth/coordinator/store"
	"github.com/berthci/berth/token"
)

// Sessions. Signing in with the admin token or a user's token (only its
// digest is stored) creates a session: a random 256-bit secret in an
// HttpOnly, SameSite=Lax cookie (Secure over https), of which the store
// keeps only the digest, so that every replica knows it and a copy of
// the database opens none. Each request checks that the session has not
// expired and that the token signed in with is still the user's (or still
// the admin token): deleting a user or rotating the admin token ends its
// sessions at once. Signing out deletes the session.
//
// Actions (POST) need the session's CSRF token in the form
// (csrf_token) or the X-CSRF-Token header: an HMAC of the session's
// secret, so it needs no storage and means nothing without the cookie.
// A POST a browser marks as cross-site (Sec-Fetch-Site) is refused
// before that. The sign-in form has a token of its own: a random value in
// a short-lived cookie that the form repeats (double submit), so no page
// can sign a browser in as someone else.

const (
	sessionCookie = "berth_session"
	signInCookie  = "berth_sign_in"
	csrfField     = "csrf_token"
	csrfHeader    = "X-CSRF-Token"
)

// principal is who a session is.
type principal struct {
	Name string
	Role store.Role
	// UserID is the user's; 0 for the admin token.
	UserID    int64
	secret    string // the session cookie's value
	csrf      string
	expiresAt time.Time
}

// CanAct reports whether the principal may act (cancel, retry, play)
// in every project: an admin.
func (p *principal) CanAct() bool { return p.Role == store.RoleAdmin }

// canActIn reports whether the request's principal may act on a
// pipeline or job of a project: an admin, or a member of the project at
// store.ActAccess(protected) or above.
func (u *UI) canActIn(r *http.Request, projectID int64, protected bool) (bool, error) {
	p := principalOf(r.Context())
	switch {
	case p == nil:
		return false, nil
	case p.CanAct():
		return true, nil
	case p.UserID == 0:
		return false, nil
	}
	l, err := store.AccessOf(r.Context(), u.st, &store.User{ID: p.UserID, Role: p.Role}, projectID)
	return l >= store.ActAccess(protected), err
}

// CSRF is the token an action's form carries.
func (p *principal) CSRF() string { return p.csrf }

type principalKey struct{}

func withPrincipal(ctx context.Context, p *principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

func principalOf(ctx context.Context) *principal {
	p, _ := ctx.Value(principalKey{}).(*principal)
	return p
}

// newSecret is 32 random bytes, base64url without padding (43 characters).
func newSecret() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic("webui: no randomness: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// parseSecret checks a session cookie's value: exactly what newSecret
// makes, so that nothing else reaches the store.
func parseSecret(v string) (string, bool) {
	if len(v) != 43 {
		return "", false
	}
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil || len(b) != 32 || base64.RawURLEncoding.EncodeToString(b) != v {
		return "", false
	}
	return v, true
}

// csrfFor derives a session's CSRF token from its secret.
func csrfFor(secret string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("berth web UI CSRF token v1"))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// errNoSession: the request has no valid session.
var errNoSession = errors.New("no session")

// session returns the principal of the request's session cookie, or
// errNoSession.
func (u *UI) session(r *http.Request) (*principal, error) {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil, errNoSession
	}
	secret, ok := parseSecret(c.Value)
	if !ok {
		return nil, errNoSession
	}
	ctx := r.Context()
	se, err := u.st.GetSession(ctx, token.Digest(secret))
	if errors.Is(err, store.ErrNotFound) {
		return nil, errNoSession
	}
	if err != nil {
		return nil, err
	}
	if !u.clock.Now().Before(se.ExpiresAt) {
		return nil, errNoSession
	}
	p := &principal{secret: secret, csrf: csrfFor(secret), expiresAt: se.ExpiresAt}
	if se.UserID == 0 {
		want, err := u.st.GetSetting(ctx, u.opts.AdminTokenSetting)
		if errors.Is(err, store.ErrNotFound) || err == nil && !token.Equal(want, se.CredentialDigest) {
			return nil, errNoSession
		}
		if err != nil {
			return nil, err
		}
		p.Name, p.Role = "admin", store.RoleAdmin
		return p, nil
	}
	user, err := u.st.GetUser(ctx, se.UserID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errNoSession
	}
	if err != nil {
		return nil, err
	}
	if !token.Equal(user.TokenDigest, se.CredentialDigest) {
		return nil, errNoSession
	}
	p.Name, p.Role, p.UserID = user.Name, user.Role, user.ID
	return p, nil
}

// principal authenticates a request, answering itself when it cannot: a
// page read is sent to the sign-in page, anything else (actions, event
// streams, htmx requests) gets 401.
func (u *UI) principal(w http.ResponseWriter, r *http.Request) *principal {
	p, err := u.session(r)
	if err == nil {
		return p
	}
	if !errors.Is(err, errNoSession) {
		u.log.Error("reading a web session", "err", err)
		http.Error(w, "500 Internal Server Error", http.StatusInternalServerError)
		return nil
	}
	if isRead(r) && r.Header.Get("HX-Request") == "" && r.Header.Get("Accept") != "text/event-stream" {
		http.Redirect(w, r, "/-/sign_in?return_to="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
		return nil
	}
	w.Header().Set("HX-Redirect", "/-/sign_in")
	http.Error(w, "401 Unauthorized: sign in", http.StatusUnauthorized)
	return nil
}

// crossSite reports a request a browser says came from another site:
// Sec-Fetch-Site says so, or its Origin is none of this site's hosts —
// the request's Host, the host a reverse proxy in front says it forwarded
// (X-Forwarded-Host: no page of another site can make a browser send
// it), or the coordinator's external URL's.
func (u *UI) crossSite(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return true
	}
	o := r.Header.Get("Origin")
	if o == "" || o == "null" {
		return false
	}
	ou, err := url.Parse(o)
	if err != nil {
		return true
	}
	for _, h := range []string{r.Host, r.Header.Get("X-Forwarded-Host"), u.externalHost} {
		if h != "" && strings.EqualFold(ou.Host, h) {
			return false
		}
	}
	return true
}

// checkCSRF answers 403 itself for a POST without the session's CSRF
// token or from another site.
func (u *UI) checkCSRF(w http.ResponseWriter, r *http.Request, p *principal) bool {
	if u.crossSite(r) {
		http.Error(w, "403 Forbidden: cross-site request", http.StatusForbidden)
		return false
	}
	got := r.Header.Get(csrfHeader)
	if got == "" {
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		got = r.PostFormValue(csrfField)
	}
	if got == "" || !hmac.Equal([]byte(got), []byte(p.csrf)) {
		http.Error(w, "403 Forbidden: missing or wrong CSRF token (reload the page)", http.StatusForbidden)
		return false
	}
	return true
}

// returnPath is where to go after signing in: a path of this site only
// ("/..." but not "//..." nor "/\..."), else "/".
func returnPath(s string) string {
	if s == "" || len(s) > 2048 || s[0] != '/' || strings.HasPrefix(s, "//") || strings.HasPrefix(s, "/\\") ||
		strings.ContainsAny(s, "\\\r\n\t\x00") {
		return "/"
	}
	v, err := url.Parse(s)
	if err != nil || v.Scheme != "" || v.Host != "" || v.User != nil || !strings.HasPrefix(v.Path, "/") || strings.HasPrefix(v.Path, "//") {
		return "/"
	}
	if v.Path == "/-/sign_in" || v.Path == "/-/sign_out" {
		return "/"
	}
	return v.RequestURI()
}

func (u *UI) setCookie(w http.ResponseWriter, name, value string, maxAge int, sameSite http.SameSite) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: "/", MaxAge: maxAge, HttpOnly: true,
		Secure: u.cfg.SecureCookies, SameSite: sameSite})
}

type signInPage struct {
	pageBase
	Token    string // the sign-in form's own CSRF token
	ReturnTo string
	Error    string
}

// handleSignIn shows the sign-in form (GET) and signs in (POST).
func (u *UI) handleSignIn(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		if p, err := u.session(r); err == nil && p != nil {
			http.Redirect(w, r, returnPath(r.URL.Query().Get("return_to")), http.StatusSeeOther)
			return
		}
		u.showSignIn(w, r, http.StatusOK, "", returnPath(r.URL.Query().Get("return_to")))
	case http.MethodPost:
		u.signIn(w, r)
	default:
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, "405 Method Not Allowed", http.StatusMethodNotAllowed)
	}
}

func (u *UI) showSignIn(w http.ResponseWriter, r *http.Request, code int, msg, returnTo string) {
	// One form token per browser: a second sign-in page (another tab,
	// a request the browser makes on its own) keeps the first's.
	tok := newSecret()
	if c, err := r.Cookie(signInCookie); err == nil {
		if v, ok := parseSecret(c.Value); ok {
			tok = v
		}
	}
	u.setCookie(w, signInCookie, tok, 3600, http.SameSiteStrictMode)
	u.render(w, r, code, "sign_in", &signInPage{pageBase: pageBase{Title: "Sign in"}, Token: tok, ReturnTo: returnTo, Error: msg})
}

func (u *UI) signIn(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "400 Bad Request", http.StatusBadRequest)
		return
	}
	returnTo := returnPath(r.PostFormValue("return_to"))
	c, err := r.Cookie(signInCookie)
	if u.crossSite(r) || err != nil || c.Value == "" || !hmac.Equal([]byte(c.Value), []byte(r.PostFormValue(csrfField))) {
		u.showSignIn(w, r, http.StatusForbidden, "The sign-in form expired. Please try again.", returnTo)
		return
	}
	tok := strings.TrimSpace(r.PostFormValue("token"))
	ctx := r.Context()
	now := u.clock.Now().UTC()
	se := &store.Session{Digest: "", CreatedAt: now, ExpiresAt: now.Add(u.cfg.SessionTTL)}
	who := ""
	if tok != "" && len(tok) <= 256 {
		digest := token.Digest(tok)
		if admin, err := u.st.GetSetting(ctx, u.opts.AdminTokenSetting); err == nil && token.Equal(admin, digest) {
			se.CredentialDigest, who = digest, "admin"
		} else if user, err := u.st.UserByTokenDigest(ctx, digest); err == nil {
			se.UserID, se.CredentialDigest, who = user.ID, user.TokenDigest, user.Name
		} else if err != nil && !errors.Is(err, store.ErrNotFound) {
			u.log.Error("signing in", "err", err)
			http.Error(w, "500 Internal Server Error", http.StatusInternalServerError)
			return
		}
	}
	if who == "" {
		u.log.Info("web sign-in refused", "remote", r.RemoteAddr)
		u.showSignIn(w, r, http.StatusUnauthorized, "That token is not valid.", returnTo)
		return
	}
	secret := newSecret()
	se.Digest = token.Digest(secret)
	if err := u.st.CreateSession(ctx, se); err != nil {
		u.log.Error("creating a web session", "err", err)
		http.Error(w, "500 Internal Server Error", http.StatusInternalServerError)
		return
	}
	if n, err := u.st.DeleteExpiredSessions(ctx, now); err != nil {
		u.log.Warn("deleting expired web sessions", "err", err)
	} else if n > 0 {
		u.log.Debug("expired web sessions deleted", "count", n)
	}
	u.log.Info("web sign-in", "user", who)
	u.setCookie(w, signInCookie, "", -1, http.SameSiteStrictMode)
	u.setCookie(w, sessionCookie, secret, int(u.cfg.SessionTTL/time.Second), http.SameSiteLaxMode)
	http.Redirect(w, r, returnTo, http.StatusSeeOther)
}

// handleSignOut ends the session (POST, with its CSRF token).
func (u *UI) handleSignOut(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r.Context())
	if err := u.st.DeleteSession(r.Context(), token.Digest(p.secret)); err != nil && !errors.Is(err, store.ErrNotFound) {
		u.log.Error("signing out", "err", err)
	}
	u.setCookie(w, sessionCookie, "", -1, http.SameSiteLaxMode)
	http.Redirect(w, r, "/-/sign_in", http.StatusSeeOther)
}

// SignInURL creates a session for the admin token as if it had signed in
// and returns a one-time URL path that sets its cookie and leads to
// returnTo (berth run --ui: the local user is signed in by opening it,
// and the link is out of the address bar at once). The link works once,
// within ttl.
func (u *UI) SignInURL(ctx context.Context, adminToken, returnTo string, ttl time.Duration) (string, error) {
	now := u.clock.Now().UTC()
	secret := newSecret()
	tk := newSecret()
	se := &store.Session{Digest: token.Digest(secret), CredentialDigest: token.Digest(adminToken), CreatedAt: now,
		ExpiresAt: now.Add(u.cfg.SessionTTL)}
	if err := u.st.CreateSession(ctx, se); err != nil {
		return "", err
	}
	u.tickets.put(tk, ticket{secret: secret, expires: now.Add(ttl), returnTo: returnPath(returnTo)})
	return "/-/sign_in/ticket?t=" + tk, nil
}

// tickets are one-time sign-in links (SignInURL): ticket → session secret.
type tickets struct {
	mu sync.Mutex
	m  map[string]ticket
}

type ticket struct {
	secret, returnTo string
	expires          time.Time
}

func (t *tickets) put(tk string, v ticket) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]ticket{}
	}
	t.m[tk] = v
}

// take returns a ticket once, if it has not expired.
func (t *tickets) take(tk string, now time.Time) (ticket, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, v := range t.m {
		if !now.Before(v.expires) {
			delete(t.m, k)
		}
	}
	v, ok := t.m[tk]
	delete(t.m, tk)
	if !ok || !now.Before(v.expires) {
		return ticket{}, false
	}
	return v, true
}

// handleTicket signs a browser in with a one-time link and sends it on
// to the UI, so the ticket leaves the address bar at once.
func (u *UI) handleTicket(w http.ResponseWriter, r *http.Request) {
	tk, ok := parseSecret(r.URL.Query().Get("t"))
	if ok {
		var v ticket
		if v, ok = u.tickets.take(tk, u.clock.Now()); ok {
			u.setCookie(w, sessionCookie, v.secret, int(u.cfg.SessionTTL/time.Second), http.SameSiteLaxMode)
			http.Redirect(w, r, v.returnTo, http.StatusSeeOther)
			return
		}
	}
	u.showSignIn(w, r, http.StatusUnauthorized, "That sign-in link was used or has expired.", "/")
}
