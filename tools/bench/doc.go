// Package bench holds the benchmarks of docs/benchmarks.md (make bench)
// and the peer designs they measure tokenguard beside: the Nango-, Grafana-
// and Coder-style designs, the seed as written, and the protocol floor.
// They are test code only, in a module of their own (tools/) so that the
// peers' dependencies (Redis's client among them) stay out of the
// library's.
package bench
