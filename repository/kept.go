package repository

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/tokenguard/tokenguard/domain"
)

// A rotation this process stored is kept in memory for a while after its commit. A failover to an
// asynchronous standby loses the last commits: a standby promoted without the rotation holds the
// refresh token the rotation spent, and only this process knows the token that replaced it. The
// lease renewer reads the kept rotations' versions at each tick and writes a missing one again,
// within the grace in which the new timeline grants no lease (restartGrace), so that no process
// presents the spent refresh token.

// keepRotations is how long after its commit a rotation is kept: the most an asynchronous standby
// is taken to lag. A standby further behind loses rotations that only a process that read their
// versions can report (usecase.ReasonRolledBack).
const keepRotations = 30 * time.Second

// keepUnread bounds how long a rotation is kept while its version cannot be read (the server is
// away) or written back: a failover that takes longer is outside what a write-back covers.
const keepUnread = 10 * time.Minute

// keptCheckDelay is how long the check of the kept rotations waits for an idle connection in the
// pool, well within restartGrace. A check on a busy pool would open a connection that the refresh
// path then takes first (database/sql reuses the newest), and a new connection prepares every
// statement again: a storm's winner would wait for that.
const keptCheckDelay = 2 * time.Second

// checkNow says whether the kept rotations are checked at this tick: on an idle connection, or
// once the pool has had none for keptCheckDelay.
func (r *leaseRenewer) checkNow(now time.Time) bool {
	pool, err := r.db.DB()
	if err != nil || pool.Stats().Idle > 0 || (!r.busySince.IsZero() && now.Sub(r.busySince) >= keptCheckDelay) {
		r.busySince = time.Time{}
		return true
	}
	if r.busySince.IsZero() {
		r.busySince = now
	}
	return false
}

// keptRotation is a rotation this process stored.
type keptRotation struct {
	token     domain.Token  // as Store wrote it, at the version it replaced
	version   int64         // the version it was stored as
	presented domain.Secret // the refresh token it replaced, spent at the provider
	at        time.Time
}

// keep records rotation t, stored as version, if this process holds the lease under which it
// presented the refresh token t replaces, and the provider rotated that token.
func (r *leaseRenewer) keep(t domain.Token, version int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.holders {
		if l.connection == t.Connection && !l.presented.IsZero() && !l.presented.Equal(t.RefreshToken) {
			r.kept = append(r.kept, keptRotation{token: t, version: version, presented: l.presented, at: time.Now()})
			r.start()
			return
		}
	}
}

// check reads the stored versions of the kept rotations' connections. A connection stored behind
// a kept rotation has its rotations written again (writeBack); a rotation found stored
// keepRotations after its commit, or whose connection is gone, is let go.
func (r *leaseRenewer) check(ctx context.Context, kept []keptRotation) {
	var names []string // quoted for an array literal: connection names hold no quote (domain.ValidateName)
	seen := map[string]bool{}
	for _, k := range kept {
		if !seen[k.token.Connection] {
			seen[k.token.Connection] = true
			names = append(names, `"`+k.token.Connection+`"`)
		}
	}
	var rows []struct {
		Name    string
		Version int64
	}
	if err := r.db.WithContext(ctx).Raw(`SELECT c.name, t.version FROM tokenguard_connections c
JOIN tokenguard_tokens t ON t.connection_id = c.id WHERE c.name = ANY(?::text[])`, "{"+strings.Join(names, ",")+"}").Scan(&rows).Error; err != nil {
		// The server is away: looked at again at the next tick. A closed pool writes nothing again.
		closed := err.Error() == "sql: database is closed" // database/sql does not export it
		r.letGo(kept, func(k keptRotation) bool { return !closed && time.Since(k.at) < keepUnread })
		return
	}
	stored := map[string]int64{}
	for _, row := range rows {
		stored[row.Name] = row.Version
	}
	lost := map[string][]keptRotation{}
	for _, k := range kept {
		if v, ok := stored[k.token.Connection]; ok && v < k.version {
			lost[k.token.Connection] = append(lost[k.token.Connection], k)
		}
	}
	done := map[string]bool{} // written back, or found not to be this process's to write
	for name, ks := range lost {
		done[name] = r.writeBack(ctx, ks) == nil
	}
	r.letGo(kept, func(k keptRotation) bool {
		v, ok := stored[k.token.Connection]
		switch {
		case !ok || done[k.token.Connection]:
			return false
		case v < k.version:
			return time.Since(k.at) < keepUnread // written back at the next tick, or given up
		}
		return time.Since(k.at) < keepRotations
	})
}

// letGo drops the rotations of kept, a prefix of r.kept (only keep appends), that stay says not to keep.
func (r *leaseRenewer) letGo(kept []keptRotation, stay func(keptRotation) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	still := slices.DeleteFunc(slices.Clone(kept), func(k keptRotation) bool { return !stay(k) })
	r.kept = append(still, r.kept[len(kept):]...)
}

// writeBack stores the newest of a connection's kept rotations found missing, oldest first, if the
// token stored holds a refresh token one of them spent: the server lost them, and that token is
// dead at the provider. A token other than those (a new grant, another process's rotation) is
// left as it is. An error leaves the rotations kept, to try again.
func (r *TokenRepository) writeBack(ctx context.Context, lost []keptRotation) error {
	newest := lost[len(lost)-1]
	cur, err := r.Get(ctx, newest.token.Connection)
	switch {
	case errors.Is(err, domain.ErrNotFound):
		return nil
	case err != nil:
		return err
	case cur.Version >= newest.version || !slices.ContainsFunc(lost, func(k keptRotation) bool { return k.presented.Equal(cur.RefreshToken) }):
		return nil
	}
	t := newest.token
	t.Version = cur.Version
	out, err := r.Store(ctx, t) // version-fenced: a change meanwhile is a conflict, looked at again
	if err != nil {
		return err
	}
	if r.onWrittenBack != nil {
		r.onWrittenBack(t.Connection, newest.version, cur.Version, out.Version)
	}
	return nil
}

// OnRotationWrittenBack sets fn, called when this process stored again a rotation the database
// lost (kept.go): connection was found at version found, behind lost, and is now at stored. Set
// it before use.
func (r *TokenRepository) OnRotationWrittenBack(fn func(connection string, lost, found, stored int64)) {
	r.onWrittenBack = fn
}
