//! The answers shardgate writes itself: refusals with their status codes
//! and small JSON bodies (DESIGN §2 "Per request").

use crate::routing::Decision;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::prelude::*;
use pingora_proxy::Session;

/// A refusal to proxy, with everything needed to answer it.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    pub status: u16,
    pub body: String,
    /// `Retry-After` in whole seconds.
    pub retry_after: Option<u64>,
    /// The router's decision, when it was one.
    pub decision: Option<Decision>,
}

impl Refusal {
    /// A router refusal: `denied` 403, `capped`/`rate-limited` 429,
    /// `no-*-shards` 503.
    pub fn decision(
        decision: Decision,
        bucket: Option<&str>,
        retry_after_secs: Option<f64>,
    ) -> Self {
        let status = match decision {
            Decision::Denied => 403,
            Decision::Capped | Decision::RateLimited => 429,
            Decision::NoShards | Decision::NoTenantShards | Decision::NoRegionShards => 503,
            Decision::Allow => 500,
        };
        let body = match bucket {
            Some(b) => format!(
                "{{\"decision\":\"{}\",\"bucket\":{}}}",
                decision.as_str(),
                json_string(b)
            ),
            None => format!("{{\"decision\":\"{}\"}}", decision.as_str()),
        };
        Refusal {
            status,
            body,
            retry_after: retry_after_secs.map(|s| (s.ceil() as u64).max(1)),
            decision: Some(decision),
        }
    }

    /// An error of shardgate's own (`unknown-domain`, `upstream-timeout`, …).
    pub fn error(status: u16, error: &str) -> Self {
        Refusal {
            status,
            body: format!("{{\"error\":{}}}", json_string(error)),
            retry_after: None,
            decision: None,
        }
    }

    /// Writes the answer; the connection stays usable when the request was
    /// read whole.
    pub async fn send(&self, session: &mut Session) -> Result<()> {
        let mut resp = ResponseHeader::build(self.status, Some(4))?;
        resp.insert_header("content-type", "application/json")?;
        resp.insert_header("content-length", self.body.len().to_string())?;
        resp.insert_header("cache-control", "no-store")?;
        if let Some(secs) = self.retry_after {
            resp.insert_header("retry-after", secs.to_string())?;
        }
        let head_only = session.req_header().method == http::Method::HEAD;
        session
            .write_response_header(Box::new(resp), head_only)
            .await?;
        if !head_only {
            session
                .write_response_body(Some(Bytes::from(self.body.clone())), true)
                .await?;
        }
        Ok(())
    }
}

/// A JSON string literal.
pub fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_map_decisions_to_status_and_body() {
        let r = Refusal::decision(Decision::RateLimited, Some("/api/export"), Some(0.2));
        assert_eq!(r.status, 429);
        assert_eq!(
            r.body,
            r#"{"decision":"rate-limited","bucket":"/api/export"}"#
        );
        assert_eq!(r.retry_after, Some(1));
        assert_eq!(
            Refusal::decision(Decision::RateLimited, Some("tenant"), Some(2.01)).retry_after,
            Some(3)
        );
        assert_eq!(Refusal::decision(Decision::Capped, None, None).status, 429);
        assert_eq!(Refusal::decision(Decision::Denied, None, None).status, 403);
        assert_eq!(
            Refusal::decision(Decision::NoRegionShards, None, None).status,
            503
        );
        assert_eq!(
            Refusal::error(404, "unknown-domain").body,
            r#"{"error":"unknown-domain"}"#
        );
    }
}
