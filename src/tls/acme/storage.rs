//! What ACME keeps on disk under `acme.storage`: the certificates as
//! `certs/HOST.{crt,key}` (read by the store) and the account, each file
//! private and written through a temporary file and a rename.

use crate::tls::store::Source;
use std::path::Path;

/// Writes `HOST.key` then `HOST.crt` (the store reads a pair by its
/// `.crt`), each through a temporary file and a rename.
pub(super) fn save(storage: &Path, host: &str, chain: &str, key: &str) -> Result<(), String> {
    let dir = storage.join("certs");
    crate::tls::private_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // Check before installing: a chain that does not load is not served.
    crate::tls::store::certified_key(chain.as_bytes(), key.as_bytes(), host, Source::Acme)?;
    write_private(&dir.join(format!("{host}.key")), key.as_bytes())?;
    write_private(&dir.join(format!("{host}.crt")), chain.as_bytes())
}

pub(super) fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| format!("{}: {e}", path.display()))
}
