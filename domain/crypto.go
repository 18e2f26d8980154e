package domain

import "errors"

// ErrUndecryptable: a stored token could not be decrypted: its key is not
// configured, or the ciphertext was altered or moved to another row or
// column. The stored value is never sent anywhere.
var ErrUndecryptable = errors.New("stored token cannot be decrypted")
