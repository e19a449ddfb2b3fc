//! Hand-written HTTP/2 frames over a plain TCP socket, for clients that misbehave in ways a
//! real HTTP/2 library refuses to (ignoring SETTINGS, never answering PING, sending junk).
//! Loopback only; every read has a timeout.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const ACK: u8 = 0x1;
pub const NO_ERROR: u32 = 0x0;
pub const REFUSED_STREAM: u32 = 0x7;

pub const RLS_PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

#[derive(Debug, Clone)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

/// What reading the next frame came to.
#[derive(Debug)]
pub enum Next {
    Frame(Frame),
    /// The server closed the connection (EOF or reset).
    Closed,
    /// Nothing arrived within the timeout.
    Silent,
}

pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn hpack_int(out: &mut Vec<u8>, first: u8, prefix_bits: u32, mut value: usize) {
    let max = (1usize << prefix_bits) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128 + 128) as u8);
        value /= 128;
    }
    out.push(value as u8);
}

fn hpack_literal(out: &mut Vec<u8>, name: &str, value: &str) {
    // Literal header field without indexing, new name, no Huffman coding.
    out.push(0x00);
    hpack_int(out, 0, 7, name.len());
    out.extend_from_slice(name.as_bytes());
    hpack_int(out, 0, 7, value.len());
    out.extend_from_slice(value.as_bytes());
}

/// The header block of a gRPC call to `path`.
pub fn grpc_request_headers(path: &str) -> Vec<u8> {
    let mut out = vec![0x83, 0x86]; // :method POST, :scheme http (static table)
    hpack_int(&mut out, 0x00, 4, 4); // :path, literal value
    hpack_int(&mut out, 0, 7, path.len());
    out.extend_from_slice(path.as_bytes());
    hpack_int(&mut out, 0x00, 4, 1); // :authority
    hpack_int(&mut out, 0, 7, "localhost".len());
    out.extend_from_slice(b"localhost");
    hpack_literal(&mut out, "content-type", "application/grpc");
    hpack_literal(&mut out, "te", "trailers");
    out
}

/// One gRPC message: uncompressed flag, 4-byte length, body.
pub fn grpc_message(body: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    out
}

pub struct RawConn {
    pub stream: TcpStream,
}

impl RawConn {
    pub fn connect(port: u16) -> std::io::Result<Self> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        Ok(Self { stream })
    }

    pub fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Preface and an empty SETTINGS frame: the start of every HTTP/2 connection.
    pub fn greet(&mut self) -> std::io::Result<()> {
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(SETTINGS, 0, 0, &[]));
        self.send(&bytes)
    }

    fn read_exact_or(&mut self, buf: &mut [u8], until: Instant) -> Result<bool, Next> {
        let mut got = 0;
        while got < buf.len() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(if got == 0 { Next::Silent } else { Next::Closed });
            }
            let _ = self.stream.set_read_timeout(Some(left));
            match self.stream.read(&mut buf[got..]) {
                Ok(0) => return Err(Next::Closed),
                Ok(n) => got += n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if got == 0 {
                        return Err(Next::Silent);
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Err(Next::Closed),
            }
        }
        Ok(true)
    }

    /// The next frame, waiting at most `timeout`.
    pub fn next(&mut self, timeout: Duration) -> Next {
        let until = Instant::now() + timeout;
        let mut head = [0u8; 9];
        if let Err(next) = self.read_exact_or(&mut head, until) {
            return next;
        }
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        // The rest of a frame whose header arrived follows promptly.
        if let Err(next) = self.read_exact_or(&mut payload, until + Duration::from_secs(5)) {
            return match next {
                Next::Silent => Next::Closed,
                other => other,
            };
        }
        Next::Frame(Frame {
            kind: head[3],
            flags: head[4],
            stream,
            payload,
        })
    }

    /// Reads frames (answering nothing) until `stop` accepts one, the connection closes, or
    /// `bound` passes. Returns the accepted frame, or `None` with whether it was closed.
    pub fn wait_for(
        &mut self,
        bound: Duration,
        mut stop: impl FnMut(&Frame) -> bool,
    ) -> Result<Frame, bool> {
        let until = Instant::now() + bound;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(false);
            }
            match self.next(left) {
                Next::Frame(f) if stop(&f) => return Ok(f),
                Next::Frame(_) => {}
                Next::Closed => return Err(true),
                Next::Silent => return Err(false),
            }
        }
    }

    /// Whether the server closes the connection within `bound`, ignoring frames it sends
    /// first (SETTINGS, PING, GOAWAY).
    pub fn closed_within(&mut self, bound: Duration) -> bool {
        matches!(self.wait_for(bound, |_| false), Err(true))
    }
}
