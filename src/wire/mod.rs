//! HTTP's rules that the layers below the proxy share with it: which
//! fields are hop-by-hop and which shardgate owns upstream, what a host and
//! a request target may be, when an HTTP/2 peer floods, and the text of
//! answers and log lines.
//! Configuration validation, TLS, the access log, the tracer and the hooks
//! ask them; the pipeline (`proxy::pipeline`) applies them. Pure rules: no
//! I/O, nothing of shardgate's above.

pub mod compress;
pub mod fields;
pub mod h2_frames;
pub mod host;
pub mod target;
pub mod text;
