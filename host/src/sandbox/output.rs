//! The guest's stdout and stderr: a sink that accepts every write and keeps only the last few
//! KiB.
//!
//! wasmtime's `MemoryOutputPipe` closes its stream once full, and a Rust guest whose `eprintln!`
//! then fails panics and loses the message that mattered. This sink never refuses a write; its
//! tail is attached to trap errors.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// How much a single `check-write` lets the guest write at once.
const WRITE_BUDGET: usize = 64 << 10;

/// Keeps the last `cap` bytes written to it. Clones share the buffer.
#[derive(Debug, Clone)]
pub(crate) struct TailSink {
    inner: Arc<Mutex<Tail>>,
}

#[derive(Debug)]
struct Tail {
    buf: Vec<u8>,
    cap: usize,
}

impl TailSink {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Tail {
                buf: Vec::new(),
                cap,
            })),
        }
    }

    fn push(&self, bytes: &[u8]) {
        let mut tail = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let cap = tail.cap;
        let bytes = &bytes[bytes.len().saturating_sub(cap)..];
        let overflow = (tail.buf.len() + bytes.len()).saturating_sub(cap);
        tail.buf.drain(..overflow);
        tail.buf.extend_from_slice(bytes);
    }

    /// Forgets what was written: a script's instance serves call after call.
    pub(crate) fn clear(&self) {
        let mut tail = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        tail.buf.clear();
    }

    /// The kept tail as text, trimmed; `None` when nothing was written.
    pub(crate) fn text(&self) -> Option<String> {
        let tail = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let text = String::from_utf8_lossy(&tail.buf);
        let text = text.trim();
        (!text.is_empty()).then(|| text.to_owned())
    }
}

impl IsTerminal for TailSink {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for TailSink {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for TailSink {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_BUDGET)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for TailSink {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for TailSink {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_only_the_tail() {
        let sink = TailSink::new(8);
        assert_eq!(sink.text(), None);
        sink.push(b"hello ");
        sink.push(b"world!");
        assert_eq!(sink.text().as_deref(), Some("o world!"));
        sink.push(b"0123456789abc");
        assert_eq!(sink.text().as_deref(), Some("56789abc"));
        let mut stream = sink.clone();
        OutputStream::write(&mut stream, Bytes::from_static(b"XY")).unwrap();
        assert_eq!(sink.text().as_deref(), Some("789abcXY"));
    }
}
