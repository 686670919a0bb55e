//! The admin listener's sessions: the gateway's deadlines set, the body
//! read (bounded), the open paths (`/healthz`, the page, `/metrics`)
//! answered and `/v1/` handed to the router once authorized, and every
//! answer given the same protective headers.

use super::page::{PAGE_CSP, PAGE_CSS, PAGE_HTML, PAGE_JS};
use super::reply::Reply;
use super::{AdminApi, MAX_BODY};
use http::{Method, Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

#[async_trait::async_trait]
impl ServeHttp for AdminApi {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        // The gateway's own deadlines for a body, a client that does not
        // read its answer, and the body read off after it: no connection
        // holds one of the listener's places longer.
        let limits = &self.control.config.limits;
        session.set_read_timeout(Some(limits.body_timeout));
        session.set_write_timeout(Some(limits.send_timeout));
        session.set_total_drain_timeout(Some(limits.body_timeout));
        into_response(self.answer(session).await)
    }
}

impl AdminApi {
    /// The answer to one request: the open paths, or `/v1/` for a caller
    /// [`AdminApi::authorized`] lets in.
    async fn answer(&self, session: &mut ServerSession) -> Reply {
        let req = session.req_header();
        let method = req.method.clone();
        let path = req.uri.path().to_string();
        let query = req.uri.query().map(str::to_string);
        match (&method, path.as_str()) {
            (&Method::GET, "/healthz") => Reply::text(StatusCode::OK, "ok\n".into(), "text/plain"),
            // The operator's page (src/ui): static, no data in it; its
            // script reads `/v1/` with the token.
            (&Method::GET, "/") => Reply::asset(PAGE_HTML, "text/html; charset=utf-8"),
            (&Method::GET, "/ui/app.js") => Reply::asset(PAGE_JS, "text/javascript; charset=utf-8"),
            (&Method::GET, "/ui/app.css") => Reply::asset(PAGE_CSS, "text/css; charset=utf-8"),
            (&Method::GET, "/ui/auth") => self.page_auth(),
            (&Method::GET, "/metrics") => self.scrape(session),
            (_, p) if p.starts_with("/v1/") || p == "/v1" => {
                if !self.authorized(session) {
                    Reply::error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token")
                } else {
                    match read_body(session).await {
                        Ok(body) => self.route(&method, &path, query.as_deref(), &body).await,
                        Err(reply) => reply,
                    }
                }
            }
            _ => Reply::error(StatusCode::NOT_FOUND, "not found"),
        }
    }
}

/// The request body, at most [`MAX_BODY`] bytes.
async fn read_body(session: &mut ServerSession) -> Result<Vec<u8>, Reply> {
    let mut body = Vec::new();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                body.extend_from_slice(&chunk);
                if body.len() > MAX_BODY {
                    return Err(Reply::error(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "body too large",
                    ));
                }
            }
            Ok(None) => return Ok(body),
            Err(e) => {
                return Err(Reply::error(
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the body: {e}"),
                ))
            }
        }
    }
}

/// The HTTP response of a reply: never cached, never sniffed, no
/// referrer, the page's CSP; a 401 says which scheme it wants.
fn into_response(reply: Reply) -> Response<Vec<u8>> {
    let mut builder = Response::builder()
        .status(reply.status)
        .header("content-type", reply.content_type)
        .header("content-length", reply.body.len().to_string())
        .header("cache-control", "no-store")
        .header("x-content-type-options", "nosniff")
        .header("referrer-policy", "no-referrer")
        .header("content-security-policy", PAGE_CSP);
    if reply.status == StatusCode::UNAUTHORIZED {
        builder = builder.header("www-authenticate", "Bearer");
    }
    builder
        .body(reply.body)
        .unwrap_or_else(|_| Response::new(Vec::new()))
}
