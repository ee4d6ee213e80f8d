//! The library behind the `ferrite` binary: the HTTP layer (routes, validation, auth,
//! metrics, request ids), its shared state, and model fetching. `main.rs` holds only the
//! command line and the process's life (logging, serving, graceful shutdown); the
//! library form lets the fuzz targets (`libfuzzer/`) call the request parser.

pub mod auth;
pub mod chat;
pub mod connection;
pub mod cors;
pub mod error;
pub mod fetch;
pub mod hosts;
pub mod images;
pub mod listen;
pub mod media;
pub mod metrics;
pub mod observe;
pub mod parse_errors;
pub mod probe;
pub mod routes;
pub mod state;
pub mod validate;
