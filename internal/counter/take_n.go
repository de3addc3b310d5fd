package counter

import "time"

// TakeN admits and counts n hits for (bucket, key) at now, atomically, iff
// all n fit under lim: for Fixed iff count + n ≤ Limit, for Sliding iff
// previous×(ScaleMS−elapsed) + (current+n)×ScaleMS ≤ Limit×ScaleMS. Hits
// that do not all fit are not counted at all (none of them). n = 1 is
// Take; n ≤ 0 counts nothing and returns what Peek would; n > Limit never
// fits. Allowed reports that the n hits were admitted and counted;
// RetryAfterMS of a denial is Take's (when one hit would be admitted).
func (s *Store) TakeN(bucket Bucket, key string, lim Limit, n int64, now time.Time) Result {
	if n <= 0 {
		return s.Peek(bucket, key, lim, now)
	}
	if !lim.valid() {
		return Result{}
	}
	// The lookup repeats Take's on purpose: a shared helper is not inlined,
	// and Take is the hot path.
	ms := now.UnixMilli()
	w, el := windowSplit(ms, lim.ScaleMS)
	k := mapKey{bucket, s.storedKey(key)}
	sh, tag := s.shardFor(k)
	sh.mu.Lock()
	i := sh.find(tag, bucket, k.key)
	if i == noEntry {
		if i = sh.insert(k, tag, lim, w, ms, s.room(sh, bucket)); i == noEntry {
			sh.mu.Unlock()
			return overflow(lim, w, el)
		}
	}
	e := &sh.entries[i]
	drop, prevUnreported := e.prepare(w, lim)
	if drop {
		sh.noteExpiry(e)
	}
	var prev int64
	if lim.Algorithm == Sliding {
		prev = e.total(w - 1)
	}
	cur := e.total(w)
	ok := admitsN(lim, el, prev, cur, n)
	near, shareRetry := false, int64(0)
	if s.track {
		sv := s.shares.Load()
		if prevUnreported && sv != 0 {
			sh.mark(i, k, w-1)
		}
		if sv != 0 && ok {
			ok, near, shareRetry = sh.takeShare(i, k, sv, lim, w, el, prev, n)
		} else if ok {
			sh.mark(i, k, w)
			near = isNear(lim, el, prev, cur+n)
		}
		near = near || (prevUnreported && sv != 0)
	}
	if ok {
		e.local[w&1] = satAdd(e.local[w&1], n)
		cur += n
	}
	sh.mu.Unlock()
	if near {
		s.signalNear()
	}
	if s.obs != nil {
		s.obs.Hit(bucket, k.key, n, ok, w, lim.ScaleMS, ms)
	}
	r := result(lim, w, el, prev, cur, ok)
	if shareRetry > 0 { // denied by this node's share, under the limit
		r.Remaining, r.RetryAfterMS = 0, shareRetry
	}
	return r
}

// admitsN reports whether n more hits (1 ≤ n) are admitted given the totals
// of the previous and current windows, elapsed ms into the current one:
// admits for n hits at once.
func admitsN(lim Limit, elapsed, prev, cur, n int64) bool {
	// n > Limit, or cur + n > Limit, written so that nothing overflows:
	// cur may be up to 2×MaxCount, n anything positive.
	if n > lim.Limit || cur > lim.Limit-n {
		return false
	}
	if lim.Algorithm == Fixed || prev == 0 {
		return true
	}
	// prev×(scale−elapsed) + (cur+n)×scale ≤ limit×scale
	room := (lim.Limit - cur - n) * lim.ScaleMS // < MaxProduct = 2^62
	d := lim.ScaleMS - elapsed                  // in [1, scale], < 2^32
	if prev < 1<<30 {
		return prev*d <= room // < 2^30 × 2^32 = 2^62
	}
	return prev <= room/d
}
