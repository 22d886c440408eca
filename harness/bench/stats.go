package bench

import (
	"math"
	"slices"
	"sync"
	"time"
)

// latencies collects durations from several goroutines.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// addAll appends a goroutine's own samples at once (cheaper than add in a
// hot loop).
func (l *latencies) addAll(ds []time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, ds...)
	l.mu.Unlock()
}

// summary is the distribution of a set of durations.
type summary struct {
	N   int
	P50 time.Duration
	P99 time.Duration
	Max time.Duration
}

func (l *latencies) summary() summary {
	l.mu.Lock()
	defer l.mu.Unlock()
	return summarize(l.d)
}

func summarize(ds []time.Duration) summary {
	if len(ds) == 0 {
		return summary{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return summary{N: len(s), P50: quantile(s, 0.50), P99: quantile(s, 0.99), Max: s[len(s)-1]}
}

// quantile returns the q-quantile of sorted s (nearest rank).
func quantile(s []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(s)))) - 1
	i = max(0, min(i, len(s)-1))
	return s[i]
}

// median of a few durations.
func median(ds []time.Duration) time.Duration {
	return summarize(ds).P50
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func perSec(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}
