//! Just enough plain HTTP/1.1 to `POST` JSON to etcd's gRPC JSON gateway.
//!
//! One request per connection (`Connection: close`), the answer read to the end; bodies
//! with `Content-Length`, chunked or ended by the close are all understood. hyper is in the
//! dependency tree only through kube and its choice of features; these few lines do not
//! depend on them.

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `POST <path>` with a JSON `body` to `addr` and returns the status code and body.
pub(crate) async fn post(addr: SocketAddr, path: &str, body: &str) -> io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    parse(&response)
}

/// Splits a complete response into its status code and (de-chunked) body.
fn parse(response: &[u8]) -> io::Result<(u16, String)> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
    let end = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| invalid("an HTTP answer without the end of its header"))?;
    let head = String::from_utf8_lossy(&response[..end]);
    let mut body = &response[end + 4..];
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| invalid("an HTTP answer without a status code"))?;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("content-length") {
            let len = value
                .parse::<usize>()
                .map_err(|_| invalid("an HTTP answer with a bad Content-Length"))?;
            body = body
                .get(..len)
                .ok_or_else(|| invalid("an HTTP answer shorter than its Content-Length"))?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
        }
    }
    let body = if chunked {
        dechunk(body).ok_or_else(|| invalid("an HTTP answer with bad chunks"))?
    } else {
        body.to_vec()
    };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// The payload of a chunked body, or `None` if it is malformed or cut short.
fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&body[..line_end]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sized_chunked_and_closed_bodies() {
        let sized = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}trailing";
        assert_eq!(parse(sized).unwrap(), (200, "{}".into()));
        let chunked =
            b"HTTP/1.1 400 Bad Request\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse(chunked).unwrap(), (400, "abcde".into()));
        let closed = b"HTTP/1.1 200 OK\r\n\r\nall of it";
        assert_eq!(parse(closed).unwrap(), (200, "all of it".into()));
        assert!(parse(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort").is_err());
        assert!(parse(b"garbage").is_err());
    }
}
