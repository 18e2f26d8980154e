package tokencrypt

import "slices"

// IDs are the ids of every configured key, sorted.
func (k *Keyring) IDs() []string { return slices.Clone(k.ids) }
