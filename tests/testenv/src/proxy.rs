//! [`Proxy`]: a loopback TCP proxy a test owns, to break the path to a server on purpose.
//!
//! It listens on `127.0.0.1:<free port>` and forwards the bytes of every connection both
//! ways to its target, e.g. the apiserver ([`crate::TestEnv::apiserver_addr`]; a client
//! using [`crate::TestEnv::kubeconfig_via`] goes through it). A test can then:
//!
//! - [`Proxy::black_hole`]: forward nothing more, in either direction, on existing and new
//!   connections, but keep every socket open, as a dead network path looks to its peers:
//!   no bytes, no FIN, no reset; requests just hang until their own timeouts.
//! - [`Proxy::heal`]: forward again, on the existing connections too; bytes sent meanwhile
//!   are delivered then.
//! - [`Proxy::cut`]: close every current connection at once, as a restarted peer would.
//!
//! The proxy forwards bytes, so TLS passes through untouched. It runs on the tokio runtime
//! that started it; dropping the [`Proxy`] stops it and closes all its connections.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::error::{Error, Result};

/// Bytes read from one side before they are written to the other.
const BUFFER: usize = 64 * 1024;

/// A TCP proxy from `127.0.0.1:<port>` to one target, which a test can black-hole
/// ([`Proxy::black_hole`]), heal ([`Proxy::heal`]) and cut ([`Proxy::cut`]).
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    target: SocketAddr,
    state: watch::Sender<State>,
    open: Arc<AtomicUsize>,
    accept: JoinHandle<()>,
}

/// What every connection of a proxy follows.
#[derive(Debug, Clone, Copy, Default)]
struct State {
    black_hole: bool,
    /// Raised by each [`Proxy::cut`]; a connection ends once it differs from its start.
    cuts: u64,
}

impl Proxy {
    /// Starts a proxy to `target` on a free port of 127.0.0.1, forwarding. Must be called
    /// within a tokio runtime, which then runs the proxy.
    pub async fn start(target: SocketAddr) -> Result<Proxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|e| Error::io(format!("binding a proxy to {target} on 127.0.0.1"), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io(format!("reading the address of the proxy to {target}"), e))?;
        let (state, watcher) = watch::channel(State::default());
        let open = Arc::new(AtomicUsize::new(0));
        let accept = tokio::spawn(accept(listener, target, watcher, open.clone()));
        tracing::debug!(%addr, %target, "proxy started");
        Ok(Proxy {
            addr,
            target,
            state,
            open,
            accept,
        })
    }

    /// Where clients connect: `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where the proxy forwards to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// From now on, forwards nothing in either direction, on current connections and on
    /// those accepted later (which do not even reach the target yet), but keeps every
    /// socket open. Bytes already handed to the kernel still arrive.
    pub fn black_hole(&self) {
        tracing::debug!(addr = %self.addr, "proxy black-holed");
        self.state.send_modify(|s| s.black_hole = true);
    }

    /// Forwards again after [`Proxy::black_hole`], on the connections kept open too: what
    /// was sent meanwhile is delivered now.
    pub fn heal(&self) {
        tracing::debug!(addr = %self.addr, "proxy healed");
        self.state.send_modify(|s| s.black_hole = false);
    }

    /// Closes every current connection, on both sides. Later connections are accepted and
    /// forwarded (or black-holed) as usual.
    pub fn cut(&self) {
        tracing::debug!(addr = %self.addr, "proxy cutting its connections");
        self.state.send_modify(|s| s.cuts += 1);
    }

    /// How many connections are open: accepted and not closed yet.
    pub fn connections(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Dropping the accept task drops its JoinSet, which aborts every connection task;
        // their sockets close with them.
        self.accept.abort();
    }
}

/// Accepts connections until aborted; each runs as a task of a set owned here.
async fn accept(
    listener: TcpListener,
    target: SocketAddr,
    state: watch::Receiver<State>,
    open: Arc<AtomicUsize>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((downstream, peer)) => {
                    let state = state.clone();
                    let guard = OpenGuard::new(open.clone());
                    connections.spawn(async move {
                        let _guard = guard;
                        if let Err(e) = connection(downstream, target, state).await {
                            tracing::debug!(%peer, %target, "proxied connection ended: {e}");
                        }
                    });
                }
                Err(e) => {
                    // E.g. out of file descriptors; that passes, so try again shortly.
                    tracing::debug!(%target, "proxy accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Counts a connection as open until dropped.
struct OpenGuard(Arc<AtomicUsize>);

impl OpenGuard {
    fn new(open: Arc<AtomicUsize>) -> OpenGuard {
        open.fetch_add(1, Ordering::Relaxed);
        OpenGuard(open)
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves one accepted connection until both sides are done, it fails, or it is cut.
async fn connection(
    mut downstream: TcpStream,
    target: SocketAddr,
    mut state: watch::Receiver<State>,
) -> io::Result<()> {
    let cuts = state.borrow().cuts;
    let mut cut_watch = state.clone();
    let cut = async move {
        // Also ends when the proxy is dropped (the sender is gone).
        let _ = cut_watch.wait_for(|s| s.cuts != cuts).await;
    };
    let forward = async {
        // Over a black-holed path, not even the connection reaches the target.
        open(&mut state).await?;
        let mut upstream = TcpStream::connect(target).await?;
        let _ = downstream.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let (down_read, down_write) = downstream.split();
        let (up_read, up_write) = upstream.split();
        tokio::try_join!(
            pump(down_read, up_write, state.clone()),
            pump(up_read, down_write, state.clone()),
        )?;
        Ok(())
    };
    tokio::select! {
        result = forward => result,
        () = cut => Err(io::Error::new(io::ErrorKind::ConnectionAborted, "cut by the test")),
    }
}

/// Copies `from` to `to` while the proxy is not black-holed, holding bytes back while it
/// is; at the end of `from`, shuts down the writing side of `to`.
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut state: watch::Receiver<State>,
) -> io::Result<()> {
    let mut buf = vec![0; BUFFER];
    loop {
        open(&mut state).await?;
        let read = tokio::select! {
            read = from.read(&mut buf) => read?,
            changed = state.changed() => {
                changed.map_err(|_| gone())?;
                continue;
            }
        };
        if read == 0 {
            open(&mut state).await?;
            return to.shutdown().await;
        }
        let mut written = 0;
        while written < read {
            open(&mut state).await?;
            // A write that loses the race against a black hole writes nothing (cancel-safe).
            tokio::select! {
                n = to.write(&buf[written..read]) => written += n?,
                changed = state.changed() => changed.map_err(|_| gone())?,
            }
        }
    }
}

/// Waits until the proxy forwards (is not black-holed).
async fn open(state: &mut watch::Receiver<State>) -> io::Result<()> {
    state
        .wait_for(|s| !s.black_hole)
        .await
        .map(|_| ())
        .map_err(|_| gone())
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "the proxy was dropped")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A server that echoes every connection, on a free port of 127.0.0.1.
    async fn echo_server() -> (SocketAddr, JoinHandle<()>) {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let (mut r, mut w) = stream.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        (addr, task)
    }

    /// Reads exactly `len` bytes, failing after a second.
    async fn read_exactly(stream: &mut TcpStream, len: usize) -> Vec<u8> {
        let mut buf = vec![0; len];
        tokio::time::timeout(Duration::from_secs(1), stream.read_exact(&mut buf))
            .await
            .expect("bytes within 1 s")
            .expect("reading");
        buf
    }

    /// Asserts that nothing arrives for a while, neither bytes nor the end of the stream.
    async fn assert_silent(stream: &mut TcpStream) {
        let mut buf = [0; 16];
        let read = tokio::time::timeout(Duration::from_millis(300), stream.read(&mut buf)).await;
        assert!(read.is_err(), "expected silence, got {read:?}");
    }

    /// Asserts that the peer closed the connection.
    async fn assert_closed(stream: &mut TcpStream) {
        let mut buf = [0; 16];
        let read = tokio::time::timeout(Duration::from_secs(1), stream.read(&mut buf))
            .await
            .expect("the close within 1 s");
        assert!(
            matches!(read, Ok(0) | Err(_)),
            "expected a close, got {read:?}"
        );
    }

    #[tokio::test]
    async fn forwards_holds_back_while_black_holed_and_delivers_after_heal() {
        let (echo, _server) = echo_server().await;
        let proxy = Proxy::start(echo).await.unwrap();
        assert_eq!(proxy.target(), echo);
        assert!(proxy.addr().ip().is_loopback());

        let mut early = TcpStream::connect(proxy.addr()).await.unwrap();
        early.write_all(b"hello").await.unwrap();
        assert_eq!(read_exactly(&mut early, 5).await, b"hello");
        assert_eq!(proxy.connections(), 1);

        proxy.black_hole();
        early.write_all(b"held").await.unwrap();
        assert_silent(&mut early).await;
        // A connection made now is accepted and stays open, silently.
        let mut late = TcpStream::connect(proxy.addr()).await.unwrap();
        late.write_all(b"late").await.unwrap();
        assert_silent(&mut late).await;
        assert_silent(&mut early).await;
        assert_eq!(proxy.connections(), 2);

        proxy.heal();
        assert_eq!(read_exactly(&mut early, 4).await, b"held");
        assert_eq!(read_exactly(&mut late, 4).await, b"late");
        early.write_all(b"again").await.unwrap();
        assert_eq!(read_exactly(&mut early, 5).await, b"again");
    }

    #[tokio::test]
    async fn cut_closes_current_connections_only() {
        let (echo, _server) = echo_server().await;
        let proxy = Proxy::start(echo).await.unwrap();
        let mut before = TcpStream::connect(proxy.addr()).await.unwrap();
        before.write_all(b"x").await.unwrap();
        assert_eq!(read_exactly(&mut before, 1).await, b"x");

        proxy.cut();
        assert_closed(&mut before).await;
        let mut after = TcpStream::connect(proxy.addr()).await.unwrap();
        after.write_all(b"y").await.unwrap();
        assert_eq!(read_exactly(&mut after, 1).await, b"y");
    }

    #[tokio::test]
    async fn cut_also_closes_black_holed_connections() {
        let (echo, _server) = echo_server().await;
        let proxy = Proxy::start(echo).await.unwrap();
        proxy.black_hole();
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_silent(&mut stream).await;
        proxy.cut();
        assert_closed(&mut stream).await;
    }

    #[tokio::test]
    async fn the_end_of_a_stream_is_forwarded() {
        let (echo, _server) = echo_server().await;
        let proxy = Proxy::start(echo).await.unwrap();
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        stream.write_all(b"bye").await.unwrap();
        stream.shutdown().await.unwrap();
        // The echo server sees the end, echoes what it got and closes its side too.
        let mut all = Vec::new();
        tokio::time::timeout(Duration::from_secs(1), stream.read_to_end(&mut all))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(all, b"bye");
    }

    #[tokio::test]
    async fn dropping_the_proxy_closes_it_and_its_connections() {
        let (echo, _server) = echo_server().await;
        let proxy = Proxy::start(echo).await.unwrap();
        let addr = proxy.addr();
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(b"z").await.unwrap();
        assert_eq!(read_exactly(&mut stream, 1).await, b"z");

        drop(proxy);
        assert_closed(&mut stream).await;
        assert!(TcpStream::connect(addr).await.is_err(), "still listening");
    }

    #[tokio::test]
    async fn an_unreachable_target_closes_the_connection() {
        // A port nothing listens on: bound, read, and closed again.
        let target = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap();
        let proxy = Proxy::start(target).await.unwrap();
        let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_closed(&mut stream).await;
    }
}
