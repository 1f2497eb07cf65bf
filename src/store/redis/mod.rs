//! The Redis store: every bucket of a request applied by one Lua script in one round trip.

pub mod script;
