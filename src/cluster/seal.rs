//! ACME private keys are sealed before they go to Redis: AES-256-GCM
//! under a key derived (HKDF-SHA256) from `cluster.secret_file`, with a
//! random nonce per value and the host as associated data, so a value
//! moved to another host's entry does not open. Whoever reads Redis without
//! the secret gets no key.

use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hkdf::{Salt, HKDF_SHA256};
use ring::rand::{SecureRandom, SystemRandom};

/// What a sealed value starts with (a PEM key starts with `-----`).
const SEALED: &str = "sealed:v1:";

pub struct Sealer {
    key: LessSafeKey,
    rng: SystemRandom,
}

/// What a value read from Redis turned out to be.
pub enum Opened {
    Sealed(String),
    /// Written by a version that stored keys in plain text.
    Plain(String),
    /// Sealed with another secret, or damaged.
    Unreadable,
}

impl Sealer {
    pub fn new(secret: &[u8]) -> Sealer {
        let prk = Salt::new(HKDF_SHA256, b"shardgate acme keys").extract(secret);
        let okm = prk.expand(&[b"aes-256-gcm v1"], &AES_256_GCM);
        // `expand` only fails for an output longer than 255 hashes; the
        // key length of AES-256-GCM is 32 bytes.
        let key = okm.map(UnboundKey::from).map_or_else(
            |_| unreachable!("HKDF output of 32 bytes"),
            LessSafeKey::new,
        );
        Sealer {
            key,
            rng: SystemRandom::new(),
        }
    }

    /// `None` only if the system's random source failed.
    pub fn seal(&self, host: &str, plain: &str) -> Option<String> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let mut data = plain.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(host.as_bytes()),
                &mut data,
            )
            .ok()?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&data);
        Some(format!(
            "{SEALED}{}",
            base64::engine::general_purpose::STANDARD.encode(out)
        ))
    }

    pub fn open(&self, host: &str, value: &str) -> Opened {
        let Some(encoded) = value.strip_prefix(SEALED) else {
            return Opened::Plain(value.to_string());
        };
        let Ok(mut data) = base64::engine::general_purpose::STANDARD.decode(encoded) else {
            return Opened::Unreadable;
        };
        if data.len() < NONCE_LEN {
            return Opened::Unreadable;
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&data[..NONCE_LEN]);
        let opened = self.key.open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(host.as_bytes()),
            &mut data[NONCE_LEN..],
        );
        match opened.ok().map(|plain| String::from_utf8(plain.to_vec())) {
            Some(Ok(text)) => Opened::Sealed(text),
            _ => Opened::Unreadable,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_key_opens_only_with_its_secret_and_its_host() {
        let sealer = Sealer::new(b"0123456789abcdef0123456789abcdef");
        let pem = "-----BEGIN PRIVATE KEY-----\nMIGH\n-----END PRIVATE KEY-----\n";
        let sealed = sealer.seal("a.example.com", pem).expect("sealed");
        assert!(!sealed.contains("PRIVATE"));
        assert_ne!(
            sealed,
            sealer.seal("a.example.com", pem).expect("sealed"),
            "fresh nonce"
        );
        assert!(matches!(sealer.open("a.example.com", &sealed), Opened::Sealed(p) if p == pem));
        assert!(matches!(
            sealer.open("b.example.com", &sealed),
            Opened::Unreadable
        ));
        let other = Sealer::new(b"another secret of at least 32 bytes!");
        assert!(matches!(
            other.open("a.example.com", &sealed),
            Opened::Unreadable
        ));
        assert!(matches!(sealer.open("a.example.com", pem), Opened::Plain(p) if p == pem));
        assert!(matches!(
            sealer.open("a.example.com", "sealed:v1:%%"),
            Opened::Unreadable
        ));
    }
}
