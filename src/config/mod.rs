//! Limits configuration: the reference server's YAML, parsed, validated and compiled into a
//! matching tree. Placeholder: the loader lands with the config change.
