//! The embedder's body phase ([`GatewayHooks::request_body`]) over one
//! request's body, the same on every transport: each piece once, in
//! order, the end once, nothing for an empty body, a refusal as
//! shardgate's answer.

use super::answer::Refusal;
use crate::proxy::hooks::{BodyCheck, GatewayHooks};
use compact_str::CompactString;
use std::sync::Arc;

/// One request's body phase, once its tenant is known.
pub struct BodyPhase {
    hooks: Arc<dyn GatewayHooks>,
    tenant: CompactString,
    /// Whether a piece was seen (the end is said only after one).
    seen: bool,
    ended: bool,
}

impl BodyPhase {
    pub(crate) fn new(hooks: Arc<dyn GatewayHooks>, tenant: CompactString) -> Self {
        BodyPhase {
            hooks,
            tenant,
            seen: false,
            ended: false,
        }
    }

    /// Passes a piece of the body (and whether it ends it) to the hook;
    /// `Err`: the answer to give instead of going on.
    pub(crate) fn piece(&mut self, data: &[u8], end: bool) -> Result<(), Refusal> {
        if self.ended || (data.is_empty() && !(end && self.seen)) {
            return Ok(());
        }
        self.seen = true;
        self.ended = end;
        match self.hooks.request_body(&self.tenant, data, end) {
            BodyCheck::Refuse { status, body } => Err(Refusal::custom(status, body)),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<(Vec<u8>, bool)>>);

    impl GatewayHooks for Recorder {
        fn request_body(&self, _tenant: &str, data: &[u8], end: bool) -> BodyCheck {
            self.0.lock().push((data.to_vec(), end));
            match data {
                b"stop" => BodyCheck::Refuse {
                    status: 422,
                    body: "{}".into(),
                },
                _ => BodyCheck::Proceed,
            }
        }
    }

    #[test]
    fn each_piece_once_then_the_end_once_and_nothing_for_an_empty_body() {
        let recorder = Arc::new(Recorder::default());
        let mut phase = BodyPhase::new(recorder.clone(), "t".into());
        assert!(phase.piece(b"", true).is_ok(), "no piece yet: no end");
        assert!(recorder.0.lock().is_empty());
        let mut phase = BodyPhase::new(recorder.clone(), "t".into());
        for (data, end) in [
            (&b"ab"[..], false),
            (b"", false),
            (b"c", false),
            (b"", true),
            (b"", true),
        ] {
            assert!(phase.piece(data, end).is_ok());
        }
        assert_eq!(
            *recorder.0.lock(),
            vec![
                (b"ab".to_vec(), false),
                (b"c".to_vec(), false),
                (vec![], true)
            ]
        );
        let mut phase = BodyPhase::new(recorder.clone(), "t".into());
        let refused = phase.piece(b"stop", false).expect_err("refused");
        assert_eq!(refused.status, 422);
    }
}
