// Package domain holds tokenguard's vocabulary: a connection's OAuth2 token,
// the rules that decide when it may be reused, and the errors callers branch
// on. It imports nothing of ours and knows nothing about storage.
package domain
