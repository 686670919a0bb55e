//! One order for one host: the ACME protocol (new order, HTTP-01
//! challenges published, validation, finalize, the chain), then the
//! certificate saved (and shared in cluster mode), checked served, and the
//! outcome on the board: issued, or failed with its backoff.

use super::board::HostStatus;
use super::storage::save;
use super::{
    unix_now, AcmeService, FIRST_BACKOFF, MAX_BACKOFF, ORDER_TIMEOUT, SHARED_CHALLENGE_WAIT,
};
use crate::cluster::acme::{AcmeRedis, Failure as SharedFailure};
use crate::tls::store::Source;
use instant_acme::{
    Account, AuthorizationStatus, ChallengeType, Identifier, NewOrder, OrderStatus, RetryPolicy,
};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl AcmeService {
    /// Orders, validates and installs a certificate for `host`.
    pub(super) async fn order_one(
        &self,
        account: &Account,
        host: &str,
        storage: &Path,
        mut shared: Option<&mut AcmeRedis>,
    ) {
        let failures = self.edge.acme.ordering(host);
        log::info!("ACME: ordering a certificate for {host}");
        let mut tokens = Vec::new();
        let result = tokio::time::timeout(
            ORDER_TIMEOUT,
            self.issue(account, host, &mut tokens, shared.as_deref_mut()),
        )
        .await
        .unwrap_or_else(|_| Err("the order did not finish within 120 s".to_string()));
        self.withdraw_challenges(&tokens, shared.as_deref_mut())
            .await;
        // Served, or a failure (with its backoff): a certificate issued but
        // not served must not be ordered again every second.
        let result = match result {
            Ok((chain, key)) => {
                self.install(storage, host, &chain, &key, shared.as_deref_mut())
                    .await
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => self.record_issued(host, shared).await,
            Err(e) => self.record_failure(host, failures, e, shared).await,
        }
    }

    /// The order itself: the chain and key (PEM). The HTTP-01 tokens it
    /// published are pushed to `tokens`, for the caller to withdraw.
    async fn issue(
        &self,
        account: &Account,
        host: &str,
        tokens: &mut Vec<String>,
        mut shared: Option<&mut AcmeRedis>,
    ) -> Result<(String, String), String> {
        let ids = [Identifier::Dns(host.to_string())];
        let mut order = account
            .new_order(&NewOrder::new(&ids))
            .await
            .map_err(|e| format!("new order: {e}"))?;
        let mut authorizations = order.authorizations();
        while let Some(authz) = authorizations.next().await {
            let mut authz = authz.map_err(|e| format!("authorization: {e}"))?;
            match authz.status {
                AuthorizationStatus::Pending => {}
                AuthorizationStatus::Valid => continue,
                other => return Err(format!("authorization is {other:?}")),
            }
            let mut challenge = authz
                .challenge(ChallengeType::Http01)
                .ok_or("the ACME server offers no HTTP-01 challenge")?;
            let key_auth = challenge.key_authorization().as_str().to_string();
            self.edge
                .publish_challenge(&challenge.token, key_auth.clone());
            tokens.push(challenge.token.clone());
            if let Some(redis) = shared.as_deref_mut() {
                // The CA may ask any node: wait until they have all read it.
                if !redis.publish_challenge(&challenge.token, &key_auth).await {
                    return Err("the challenge could not be shared through Redis".to_string());
                }
                tokio::time::sleep(SHARED_CHALLENGE_WAIT).await;
            }
            challenge
                .set_ready()
                .await
                .map_err(|e| format!("challenge: {e}"))?;
        }
        let retry = RetryPolicy::new()
            .initial_delay(Duration::from_millis(250))
            .timeout(Duration::from_secs(60));
        let status = order
            .poll_ready(&retry)
            .await
            .map_err(|e| format!("validation: {e}"))?;
        if status != OrderStatus::Ready {
            return Err(format!("order is {status:?} after validation"));
        }
        let key = order
            .finalize()
            .await
            .map_err(|e| format!("finalize: {e}"))?;
        let chain = order
            .poll_certificate(&retry)
            .await
            .map_err(|e| format!("certificate: {e}"))?;
        Ok((chain, key))
    }

    /// Takes back the HTTP-01 challenges an order published, here and in
    /// Redis.
    async fn withdraw_challenges(&self, tokens: &[String], mut shared: Option<&mut AcmeRedis>) {
        for token in tokens {
            self.edge.withdraw_challenge(token);
            if let Some(redis) = shared.as_deref_mut() {
                redis.withdraw_challenge(token).await;
            }
        }
    }

    /// Saves the issued chain and key, shares them in cluster mode, and
    /// checks that the store now serves them.
    async fn install(
        &self,
        storage: &Path,
        host: &str,
        chain: &str,
        key: &str,
        shared: Option<&mut AcmeRedis>,
    ) -> Result<(), String> {
        let saved = save(storage, host, chain, key);
        // Other nodes get the certificate through Redis (read back from
        // disk: `save` checked it).
        if let Some(redis) = shared {
            if !redis.still_locked().await {
                log::warn!("ACME: the ordering lock expired during the order for {host}; another node may have ordered it too");
            }
            if saved.is_ok() && !redis.put_cert(host, chain, key).await {
                log::warn!("ACME: the certificate for {host} could not be shared through Redis; other nodes order it again");
            }
        }
        saved?;
        self.served(host)
    }

    /// Reloads the store and checks that it serves ACME's certificate for
    /// `host`, unexpired.
    fn served(&self, host: &str) -> Result<(), String> {
        let store = self.edge.store.as_ref().ok_or("no certificate store")?;
        store.reload();
        match store.covering(host) {
            Some(c) if c.source == Source::Acme && c.expires > unix_now() as i64 => Ok(()),
            _ => Err(format!(
                "the certificate issued for {host} is not served (see GET /v1/certs errors)"
            )),
        }
    }

    /// The order succeeded: counted, logged, and any failure shared in
    /// Redis cleared.
    async fn record_issued(&self, host: &str, shared: Option<&mut AcmeRedis>) {
        if let Some(redis) = shared {
            redis.clear_failure(host).await;
        }
        let board = &self.edge.acme;
        board.issued.fetch_add(1, Ordering::Relaxed);
        log::info!("ACME: certificate for {host} issued and served");
        board.set(host, HostStatus::issued());
    }

    /// The order failed after `failures` failed ones in a row: the host
    /// waits 1 min, doubling with each failure to 6 h, on this node (and
    /// on every node, in cluster mode).
    async fn record_failure(
        &self,
        host: &str,
        failures: u32,
        error: String,
        shared: Option<&mut AcmeRedis>,
    ) {
        let board = &self.edge.acme;
        board.failed.fetch_add(1, Ordering::Relaxed);
        let wait = FIRST_BACKOFF
            .saturating_mul(1 << failures.min(16))
            .min(MAX_BACKOFF);
        log::warn!("ACME: order for {host} failed ({error}); next try in {wait:?}");
        if let Some(redis) = shared {
            let failure = SharedFailure {
                failures: failures.saturating_add(1),
                last_error: error.clone(),
                retry_at: unix_now() + wait.as_secs(),
            };
            redis.set_failure(host, &failure, wait).await;
        }
        board.set(
            host,
            HostStatus::failed(
                failures.saturating_add(1),
                error,
                unix_now() + wait.as_secs(),
                Some(Instant::now() + wait),
            ),
        );
    }
}
