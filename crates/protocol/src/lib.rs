//! OpenAI-compatible wire types for ferrite's HTTP API: the completion request as clients
//! send it, the responses and stream chunks we send back, and the error body. Plain serde
//! types: no validation, no engine, no I/O.

mod request;
mod response;

pub use request::*;
pub use response::*;
