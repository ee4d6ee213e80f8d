//! OpenAI-compatible wire types for ferrite's HTTP API: the completion request as clients
//! send it (a chat request adds its own fields to it), the responses and stream chunks we
//! send back for both routes, and the error body. Plain serde
//! types: no validation, no engine, no I/O.

mod chat;
mod fields;
mod prompt;
mod request;
mod response;

pub use chat::*;
pub use fields::*;
pub use request::*;
pub use response::*;
