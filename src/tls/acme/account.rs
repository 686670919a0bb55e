//! The ACME account: read from `storage/account.json` or created at the
//! CA and saved there, on the first host due; while the CA cannot be
//! reached it is tried again after 5 s, doubling to 10 min.

use super::board::Board;
use super::storage::write_private;
use super::ACCOUNT_TIMEOUT;
use crate::config::AcmeConfig;
use instant_acme::{Account, AccountCredentials, NewAccount};
use std::time::{Duration, Instant};

/// The account once loaded, and when to try again until then.
pub(super) struct AccountSlot {
    account: Option<Account>,
    retry: Instant,
    backoff: Duration,
}

impl AccountSlot {
    pub(super) fn new() -> Self {
        AccountSlot {
            account: None,
            retry: Instant::now(),
            backoff: Duration::from_secs(5),
        }
    }

    /// The account, loaded now if it is not yet and its backoff is over;
    /// `None` while it cannot be had (the board shows the last error).
    pub(super) async fn get(&mut self, config: &AcmeConfig, board: &Board) -> Option<&Account> {
        if self.account.is_none() {
            if Instant::now() < self.retry {
                return None;
            }
            let loaded = tokio::time::timeout(ACCOUNT_TIMEOUT, load_account(config))
                .await
                .unwrap_or_else(|_| Err("the ACME server did not answer in time".to_string()));
            match loaded {
                Ok(a) => {
                    *board.account_error.lock() = None;
                    self.account = Some(a);
                }
                Err(e) => {
                    log::error!("ACME account at {}: {e}", config.directory);
                    *board.account_error.lock() = Some(e);
                    self.retry = Instant::now() + self.backoff;
                    self.backoff = (self.backoff * 2).min(Duration::from_secs(600));
                    return None;
                }
            }
        }
        self.account.as_ref()
    }
}

/// The account in `storage/account.json`, or a new one saved there.
async fn load_account(config: &AcmeConfig) -> Result<Account, String> {
    let path = config.storage.join("account.json");
    let builder = || match &config.ca_file {
        Some(ca) => Account::builder_with_root(ca).map_err(|e| format!("ca_file: {e}")),
        None => Account::builder().map_err(|e| e.to_string()),
    };
    if let Ok(saved) = std::fs::read(&path) {
        let credentials: AccountCredentials =
            serde_json::from_slice(&saved).map_err(|e| format!("{}: {e}", path.display()))?;
        return builder()?
            .from_credentials(credentials)
            .await
            .map_err(|e| e.to_string());
    }
    let contact = config.email.as_ref().map(|e| format!("mailto:{e}"));
    let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
    let (account, credentials) = builder()?
        .create(
            &NewAccount {
                contact: &contacts,
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            config.directory.clone(),
            None,
        )
        .await
        .map_err(|e| e.to_string())?;
    let json = serde_json::to_vec_pretty(&credentials).map_err(|e| e.to_string())?;
    crate::tls::private_dir(&config.storage)
        .map_err(|e| format!("{}: {e}", config.storage.display()))?;
    write_private(&path, &json)?;
    log::info!("ACME: account created at {}", config.directory);
    Ok(account)
}
