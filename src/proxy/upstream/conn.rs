//! A connection to a shard, plain or TLS (`https` shards), and the client
//! side of upstream TLS: rustls with the ring provider Pingora is built
//! with, SNI = the shard's host name, the certificate verified against
//! `server.ca_file` (else the system's roots) unless
//! `upstream.tls_verify: false`.

use super::h2_stream::ShardStream;
pub use crate::control::UpstreamKey;
use crate::proxy::pipeline::failure::AttemptFailure;
use crate::proxy::pipeline::watch::quiet;
use pingora::tls::{ClientTlsStream, RootCertStore, ServerName, TlsConnector};
use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A connection to a shard, or one stream on a shared HTTP/2 connection
/// to it (which reads and writes as an HTTP/1.1 exchange, see
/// [`ShardStream`]).
pub(crate) enum Conn {
    Plain(TcpStream),
    Tls(Box<ClientTlsStream<TcpStream>>),
    H2(Box<ShardStream>),
}

impl Conn {
    /// The TCP socket under it (none for an HTTP/2 stream: its connection
    /// is shared).
    fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Conn::Plain(tcp) => Some(tcp),
            Conn::Tls(tls) => Some(tls.get_ref().0),
            Conn::H2(_) => None,
        }
    }

    /// How an HTTP/2 stream failed, when its shard said more than a
    /// closed connection does (it refused the stream, or it shut the
    /// connection down before reading it: unprocessed).
    pub(crate) fn failure(&self) -> Option<AttemptFailure> {
        match self {
            Conn::H2(stream) => stream.failure(),
            _ => None,
        }
    }

    /// Whether an idle connection has nothing to read: neither closed by
    /// the shard nor sent bytes no request asked for (which must never
    /// answer the next request). One non-blocking peek, a real system call
    /// (the reactor may not have seen bytes that just arrived). On TLS,
    /// bytes there are read into rustls (without the reactor, which may
    /// not know of them either): records that carry no data, a session
    /// ticket sent after the response, leave the connection quiet.
    pub(crate) fn is_quiet(&mut self) -> bool {
        // An HTTP/2 stream is never pooled: its connection is.
        let Some(tcp) = self.tcp() else {
            return false;
        };
        let fd = tcp.as_raw_fd();
        if quiet(fd) {
            return match self {
                Conn::Tls(tls) => !has_plaintext(tls),
                _ => true,
            };
        }
        let Conn::Tls(tls) = self else {
            return false;
        };
        let session = tls.get_mut().1;
        let mut socket = RawRead(fd);
        // A few records at most: more is a shard talking out of turn.
        for _ in 0..8 {
            match session.read_tls(&mut socket) {
                Ok(0) => return false,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return !has_plaintext(tls);
                }
                Err(_) => return false,
            }
        }
        false
    }

    /// Ready when a read would find bytes, the end or an error, without
    /// holding a buffer: the reactor's readiness (no system call), or at
    /// once if TLS already holds decrypted bytes.
    pub(crate) fn poll_readable(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Conn::Tls(tls) = self {
            if has_plaintext(tls) {
                return Poll::Ready(Ok(()));
            }
        }
        match self {
            Conn::H2(stream) => stream.poll_readable(cx),
            Conn::Plain(tcp) => tcp.poll_read_ready(cx),
            Conn::Tls(tls) => tls.get_ref().0.poll_read_ready(cx),
        }
    }
}

/// Whether rustls holds decrypted bytes or the shard's close (after
/// processing what it has read).
fn has_plaintext(tls: &mut ClientTlsStream<TcpStream>) -> bool {
    tls.get_mut().1.process_new_packets().map_or(true, |state| {
        state.plaintext_bytes_to_read() > 0 || state.peer_has_closed()
    })
}

/// Reads a socket without the reactor: `recv` with `MSG_DONTWAIT`.
struct RawRead(std::os::fd::RawFd);

impl io::Read for RawRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for `buf.len()` bytes; on a closed or
        // foreign descriptor recv fails, which is returned.
        let n = unsafe {
            libc::recv(
                self.0,
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        match n {
            n if n >= 0 => Ok(n as usize),
            _ => Err(io::Error::last_os_error()),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Conn::Tls(tls) => Pin::new(&mut **tls).poll_read(cx, buf),
            Conn::H2(stream) => Pin::new(&mut **stream).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Conn::Tls(tls) => Pin::new(&mut **tls).poll_write(cx, buf),
            Conn::H2(stream) => Pin::new(&mut **stream).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Conn::Tls(tls) => Pin::new(&mut **tls).poll_flush(cx),
            Conn::H2(stream) => Pin::new(&mut **stream).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Conn::Tls(tls) => Pin::new(&mut **tls).poll_shutdown(cx),
            Conn::H2(stream) => Pin::new(&mut **stream).poll_shutdown(cx),
        }
    }
}

/// The client side of upstream TLS, built once: offering ALPN
/// `http/1.1`, `h2`, or both (an `auto` shard picks).
pub(crate) struct UpstreamTls {
    http1: TlsConnector,
    h2: TlsConnector,
    either: TlsConnector,
}

/// What a TLS handshake offers through ALPN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Alpn {
    Http1,
    H2,
    Either,
}

impl UpstreamTls {
    /// Trusts the CAs in `ca_file` (PEM), else the system's roots; with
    /// `verify` false, any certificate (development only).
    pub(crate) fn new(ca_file: Option<&str>, verify: bool) -> Result<Self, String> {
        use pingora::tls::{version, ClientConfig};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&version::TLS13, &version::TLS12])
            .map_err(|e| format!("upstream TLS: {e}"))?;
        let mut config = if verify {
            let mut roots = RootCertStore::empty();
            match ca_file {
                Some(path) => pingora::tls::load_ca_file_into_store(path, &mut roots)
                    .map_err(|e| format!("server.ca_file `{path}`: {e}"))?,
                None => {
                    if let Err(e) =
                        pingora::tls::load_platform_certs_incl_env_into_store(&mut roots)
                    {
                        log::warn!("upstream TLS: the system's CA certificates: {e}");
                    }
                }
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth()
        };
        let mut offering = |alpn: &[&[u8]]| {
            config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
            TlsConnector::from(Arc::new(config.clone()))
        };
        Ok(UpstreamTls {
            http1: offering(&[b"http/1.1"]),
            h2: offering(&[b"h2"]),
            either: offering(&[b"h2", b"http/1.1"]),
        })
    }

    /// The TLS handshake on `tcp` for the shard named `name`, offering
    /// `http/1.1`.
    pub(crate) async fn connect(
        &self,
        name: ServerName<'static>,
        tcp: TcpStream,
    ) -> io::Result<Conn> {
        Ok(self.connect_offering(name, tcp, Alpn::Http1).await?.0)
    }

    /// The TLS handshake offering `alpn`; and whether the shard picked
    /// `h2`.
    pub(crate) async fn connect_offering(
        &self,
        name: ServerName<'static>,
        tcp: TcpStream,
        alpn: Alpn,
    ) -> io::Result<(Conn, bool)> {
        let connector = match alpn {
            Alpn::Http1 => &self.http1,
            Alpn::H2 => &self.h2,
            Alpn::Either => &self.either,
        };
        let tls = connector.connect(name, tcp).await?;
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        Ok((Conn::Tls(Box::new(tls)), h2))
    }
}

/// `upstream.tls_verify: false`: any certificate for any name is taken
/// (the handshake's signatures are still checked, so the peer holds the
/// key of the certificate it sent).
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &pingora::tls::CertificateDer<'_>,
        _intermediates: &[pingora::tls::CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: pingora::tls::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &pingora::tls::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &pingora::tls::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
