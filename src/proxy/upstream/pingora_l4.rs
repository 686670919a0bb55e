//! Pingora's own connections to cleartext `h2` shards (its connector:
//! `server.fast_path: false`, or an embedder's server wrapping the
//! gateway), watched for floods as the fast transport's are
//! ([`Watched`]): Pingora dials them through this connector (its
//! `custom_l4`), and its h2 client reads and writes the shard through the
//! watch. A flooding shard's reads fail: its connection closes, its
//! streams fail as a reset connection's do.
//!
//! Not over TLS: Pingora's TLS sits above this connector, where the watch
//! would see only ciphertext.

use crate::proxy::watched::Watched;
use async_trait::async_trait;
use pingora::connectors::L4Connect;
use pingora::protocols::l4::ext::set_tcp_keepalive;
use pingora::protocols::l4::socket::SocketAddr;
use pingora::protocols::l4::stream::Stream;
use pingora::protocols::l4::virt::{VirtualSockOpt, VirtualSocket, VirtualSocketStream};
use pingora::{Error, ErrorType, OrErr, Result};
use std::io;
use std::sync::{Arc, OnceLock};
use tokio::net::TcpStream;

/// The one connector (it holds nothing): what a cleartext `h2` shard's
/// peer is given on Pingora's path.
pub(crate) fn watched_connector() -> Arc<dyn L4Connect + Send + Sync> {
    static CONNECTOR: OnceLock<Arc<dyn L4Connect + Send + Sync>> = OnceLock::new();
    Arc::clone(CONNECTOR.get_or_init(|| Arc::new(WatchedConnect)))
}

/// Dials a shard and watches the connection (see the module
/// documentation). Pingora bounds the dial (`total_connection_timeout`)
/// and sets the socket's options through [`VirtualSocket`].
#[derive(Debug)]
struct WatchedConnect;

#[async_trait]
impl L4Connect for WatchedConnect {
    async fn connect(&self, addr: &SocketAddr) -> Result<Stream> {
        let Some(&inet) = addr.as_inet() else {
            return Error::e_explain(ErrorType::ConnectError, "an h2 shard is dialled over TCP");
        };
        let tcp = TcpStream::connect(inet)
            .await
            .or_err_with(ErrorType::ConnectRefused, || {
                format!("connecting to {inet}")
            })?;
        let watched = Box::new(Watched::shard(tcp, inet));
        Ok(Stream::from(VirtualSocketStream::new(watched)))
    }
}

/// A shard's watched TCP connection, as Pingora's virtual socket.
impl VirtualSocket for Watched<TcpStream> {
    fn set_socket_option(&self, opt: VirtualSockOpt) -> io::Result<()> {
        let tcp = &self.inner;
        match opt {
            VirtualSockOpt::NoDelay => tcp.set_nodelay(true),
            VirtualSockOpt::KeepAlive(ka) => {
                set_tcp_keepalive(tcp, &ka).map_err(|e| io::Error::other(e.to_string()))
            }
            _ => Ok(()),
        }
    }
}
