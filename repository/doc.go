// Package repository stores connection tokens in Postgres through GORM and
// owns every lock tokenguard takes. It is the only package that writes SQL.
package repository
