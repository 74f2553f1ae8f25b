// Package config reads train.toml, the embedded trainer's configuration:
// strict decoding, --set overrides, validation with file:line errors, and
// the hash of the fields that change the math.
package config
