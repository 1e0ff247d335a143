//! A threaded HTTP/1.1 proxy with faults set at run time: the network
//! failures a remote image mount must survive (latency, cut and reset
//! connections, corrupted bytes, error statuses, a server that never
//! answers), made on demand between a client and a real server.

use std::collections::HashMap;
use std::io::{self, BufReader, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::wire::{self, Forward, Framing, Head, Sink};

/// The buffer each connection copies bodies through: large enough that a
/// body streams at loopback speed with few system calls.
const COPY_BUFFER: usize = 256 * 1024;

/// The faults the proxy applies; the default is none.
///
/// Body offsets count the response body's data bytes, from 0, whatever
/// its framing. The faults apply to each request whose target matches
/// [`only_path_containing`](Faults::only_path_containing), as they are
/// once the proxy has read its head and any stall is over.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// A delay before each request is forwarded (or answered by `status`).
    pub latency: Duration,
    /// Close the client connection abruptly, with a TCP reset, once this
    /// many response body bytes are sent; the client may get fewer, as a
    /// reset discards what is still in flight.
    pub reset_after: Option<u64>,
    /// Send the whole response head but only this many body bytes, then
    /// close the client connection normally. The earlier of `reset_after`
    /// and `truncate_after` wins; a body no longer than the limit is sent
    /// whole.
    pub truncate_after: Option<u64>,
    /// Invert the byte at this offset of every response body.
    pub flip_byte_at: Option<u64>,
    /// Answer every request with this status and an empty body, without
    /// contacting the upstream server.
    pub status: Option<u16>,
    /// The body of the answers `status` gives: this many bytes of text
    /// instead of none (a server that sends its error page, however large).
    pub status_body: u64,
    /// Read each request's head but do not answer until this is cleared
    /// (the request is then forwarded) or the proxy is dropped (the
    /// connection is then closed).
    pub stall: bool,
    /// Apply the faults only to requests whose target (path and query)
    /// contains this; all requests if `None`.
    pub only_path_containing: Option<String>,
}

impl Faults {
    /// Whether the faults apply to a request for `target`.
    fn apply_to(&self, target: &str) -> bool {
        self.only_path_containing
            .as_ref()
            .is_none_or(|part| target.contains(part.as_str()))
    }

    /// Where to cut a response body, if anywhere.
    fn cut(&self) -> Option<(u64, Cut)> {
        match (self.reset_after, self.truncate_after) {
            (Some(reset), Some(truncate)) if truncate < reset => Some((truncate, Cut::Truncate)),
            (Some(reset), _) => Some((reset, Cut::Reset)),
            (None, truncate) => truncate.map(|at| (at, Cut::Truncate)),
        }
    }
}

/// How a response body is cut short.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// A TCP reset.
    Reset,
    /// A normal close.
    Truncate,
}

/// An HTTP/1.1 proxy on 127.0.0.1 forwarding to one upstream server, with
/// [`Faults`] set at run time. Dropping it closes every connection and
/// joins every thread.
///
/// Each client connection gets a thread and its own upstream connection,
/// both kept alive as long as client and server keep them. Heads are
/// forwarded unchanged; bodies (`Content-Length` or chunked, requests and
/// responses alike, or a response up to the close) are streamed through a
/// fixed buffer, never held whole. An `Expect: 100-continue` request's
/// body is sent without waiting for the interim response, which is
/// relayed when it comes. If the upstream server cannot be reached or
/// closes a kept-alive connection before answering, the client gets a 502
/// and its connection is closed.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

/// What the proxy's threads share.
struct Shared {
    upstream: SocketAddr,
    state: Mutex<State>,
    /// Signalled when the faults change or the proxy stops.
    changed: Condvar,
    requests: AtomicU64,
}

struct State {
    faults: Faults,
    stopping: bool,
    /// Each open connection's sockets (clones), to shut them down when the
    /// proxy stops, whatever their threads are blocked in.
    sockets: HashMap<u64, Vec<TcpStream>>,
}

impl Proxy {
    /// Starts a proxy to `upstream`, on a free port of 127.0.0.1, without
    /// faults.
    pub fn start(upstream: SocketAddr) -> io::Result<Proxy> {
        Proxy::start_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), upstream)
    }

    /// Starts a proxy to `upstream` on `addr`, without faults: e.g. on the
    /// address of a proxy dropped before, so that a client that found the
    /// server gone finds it back at the same URL.
    pub fn start_on(addr: SocketAddr, upstream: SocketAddr) -> io::Result<Proxy> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            state: Mutex::new(State {
                faults: Faults::default(),
                stopping: false,
                sockets: HashMap::new(),
            }),
            changed: Condvar::new(),
            requests: AtomicU64::new(0),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name("proxy-accept".into())
                .spawn(move || accept(&listener, &shared))?
        };
        Ok(Proxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// Replaces the faults; requests already stalled are released if the
    /// new faults do not stall them.
    pub fn set(&self, faults: Faults) {
        self.shared.lock().faults = faults;
        self.shared.changed.notify_all();
    }

    /// How many requests clients have sent, answered or not.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its base URL, `http://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        {
            let mut state = self.shared.lock();
            state.stopping = true;
            for socket in state.sockets.values().flatten() {
                // Fails only for a socket already shut down.
                let _ = socket.shutdown(Shutdown::Both);
            }
        }
        self.shared.changed.notify_all();
        // Wakes the acceptor from `accept`; it then sees `stopping`.
        let _ = TcpStream::connect(self.addr);
        if let Some(acceptor) = self.acceptor.take() {
            // An acceptor that panicked has nothing left to clean up.
            let _ = acceptor.join();
        }
    }
}

/// Accepts connections, a thread each, until the proxy stops; then joins
/// the connection threads.
fn accept(listener: &TcpListener, shared: &Arc<Shared>) {
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    for (id, stream) in (0u64..).zip(listener.incoming()) {
        if shared.lock().stopping {
            break;
        }
        // A failed accept (the client already gone, or out of descriptors
        // for a moment) loses only that connection.
        let Ok(stream) = stream else { continue };
        workers.retain(|worker| !worker.is_finished());
        let Ok(registration) = Registration::new(shared, id, &stream) else {
            continue;
        };
        let shared = Arc::clone(shared);
        let worker = thread::Builder::new()
            .name(format!("proxy-conn-{id}"))
            .spawn(move || {
                // A connection ends on its first error: the client or the
                // server went away, or broke the protocol.
                let _ = serve(&shared, &registration, stream);
            });
        if let Ok(worker) = worker {
            workers.push(worker);
        }
    }
    for worker in workers {
        let _ = worker.join();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent whatever a panicking holder did.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The faults for a request for `target`.
    fn faults_for(&self, target: &str) -> Faults {
        let state = self.lock();
        if state.faults.apply_to(target) {
            state.faults.clone()
        } else {
            Faults::default()
        }
    }

    /// Waits `delay`, or until the proxy stops; false if it stopped.
    fn pause(&self, delay: Duration) -> bool {
        let deadline = Instant::now() + delay;
        let mut state = self.lock();
        loop {
            let now = Instant::now();
            if state.stopping || now >= deadline {
                return !state.stopping;
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Waits while the faults stall requests for `target`; false if the
    /// proxy stopped.
    fn stall(&self, target: &str) -> bool {
        let mut state = self.lock();
        while !state.stopping && state.faults.stall && state.faults.apply_to(target) {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        !state.stopping
    }
}

/// A connection's sockets, known to the proxy until it is dropped, so the
/// proxy can shut them down when it stops. The last descriptor of a socket
/// is closed only when this is dropped too.
struct Registration {
    shared: Arc<Shared>,
    id: u64,
}

impl Registration {
    fn new(shared: &Arc<Shared>, id: u64, client: &TcpStream) -> io::Result<Registration> {
        let registration = Registration {
            shared: Arc::clone(shared),
            id,
        };
        registration.add(client)?;
        Ok(registration)
    }

    /// Adds `socket`; fails, shutting it down, if the proxy is stopping.
    fn add(&self, socket: &TcpStream) -> io::Result<()> {
        let mut state = self.shared.lock();
        if state.stopping {
            let _ = socket.shutdown(Shutdown::Both);
            return Err(io::Error::new(io::ErrorKind::Interrupted, "proxy stopping"));
        }
        state
            .sockets
            .entry(self.id)
            .or_default()
            .push(socket.try_clone()?);
        Ok(())
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.shared.lock().sockets.remove(&self.id);
    }
}

/// Serves one client connection, request after request.
fn serve(shared: &Shared, registration: &Registration, client: TcpStream) -> io::Result<()> {
    client.set_nodelay(true)?;
    let mut client = BufReader::with_capacity(64 * 1024, client);
    let mut upstream: Option<BufReader<TcpStream>> = None;
    let mut buf = vec![0; COPY_BUFFER];
    while let Some(request) = wire::read_head(&mut client)? {
        shared.requests.fetch_add(1, Ordering::Relaxed);
        let (method, target) = request.method_and_target()?;
        if !shared.stall(target) {
            return Ok(());
        }
        let faults = shared.faults_for(target);
        if !shared.pause(faults.latency) {
            return Ok(());
        }
        let request_body = wire::request_framing(&request)?;
        if let Some(status) = faults.status {
            wire::copy_body(
                request_body,
                &mut client,
                &mut Forward(io::sink()),
                &mut buf,
            )?;
            // A HEAD's answer has no body, whatever its length says.
            let body = if method == "HEAD" {
                0
            } else {
                faults.status_body
            };
            answer(client.get_mut(), status, body)?;
            continue;
        }
        let server = match &mut upstream {
            Some(server) => server,
            None => match connect(shared, registration) {
                Ok(server) => upstream.insert(server),
                Err(_) => return answer(client.get_mut(), 502, 0),
            },
        };
        server.get_mut().write_all(&request.raw)?;
        wire::copy_body(
            request_body,
            &mut client,
            &mut Forward(server.get_mut()),
            &mut buf,
        )?;
        let Some(response) = read_response(server, client.get_mut())? else {
            // The server closed the connection without answering: one it
            // kept alive timed out (or it failed).
            return answer(client.get_mut(), 502, 0);
        };
        client.get_mut().write_all(&response.raw)?;
        let framing = wire::response_framing(method, &response)?;
        let mut sink = FaultySink::new(client.get_mut(), &faults);
        if let Err(e) = wire::copy_body(framing, server, &mut sink, &mut buf) {
            return match sink.cut {
                Some(cut) => apply(cut, client.get_mut()),
                None => Err(e),
            };
        }
        if framing == Framing::UntilClose
            || response.has_token("connection", "close")
            || request.has_token("connection", "close")
        {
            return Ok(());
        }
    }
    Ok(())
}

/// Connects to the upstream server.
fn connect(shared: &Shared, registration: &Registration) -> io::Result<BufReader<TcpStream>> {
    let server = TcpStream::connect(shared.upstream)?;
    server.set_nodelay(true)?;
    registration.add(&server)?;
    Ok(BufReader::with_capacity(64 * 1024, server))
}

/// Reads the server's final response head, relaying interim (1xx) ones to
/// the client; `None` if the server closed the connection first.
fn read_response(
    server: &mut BufReader<TcpStream>,
    client: &mut TcpStream,
) -> io::Result<Option<Head>> {
    loop {
        let Some(head) = wire::read_head(server)? else {
            return Ok(None);
        };
        let status = head.status()?;
        if !(100..200).contains(&status) || status == 101 {
            return Ok(Some(head));
        }
        client.write_all(&head.raw)?;
    }
}

/// Answers the client with `status` and a body of `body` bytes of text.
/// A 502 (no answer from the server) closes the connection; other
/// statuses keep it.
fn answer(client: &mut TcpStream, status: u16, body: u64) -> io::Result<()> {
    let connection = if status == 502 { "close" } else { "keep-alive" };
    write!(
        client,
        "HTTP/1.1 {status} Injected\r\nContent-Length: {body}\r\nConnection: {connection}\r\n\r\n"
    )?;
    let page = [b'x'; 64 << 10];
    let mut left = body;
    while left > 0 {
        let n = left.min(page.len() as u64);
        client.write_all(&page[..n as usize])?;
        left -= n;
    }
    Ok(())
}

/// Ends a client connection as `cut` says.
fn apply(cut: Cut, client: &mut TcpStream) -> io::Result<()> {
    match cut {
        // With a zero linger time, closing the socket's last descriptor
        // (when the connection's registration is dropped) sends a reset.
        Cut::Reset => socket2::SockRef::from(&*client).set_linger(Some(Duration::ZERO)),
        Cut::Truncate => client.shutdown(Shutdown::Write),
    }
}

/// Writes a response body to the client, with the body faults applied.
struct FaultySink<'a> {
    client: &'a mut TcpStream,
    /// The offset of the next data byte.
    offset: u64,
    flip_at: Option<u64>,
    cut_at: Option<(u64, Cut)>,
    /// Set once the body is cut: copying then fails, and the connection
    /// must be ended this way.
    cut: Option<Cut>,
}

impl<'a> FaultySink<'a> {
    fn new(client: &'a mut TcpStream, faults: &Faults) -> Self {
        FaultySink {
            client,
            offset: 0,
            flip_at: faults.flip_byte_at,
            cut_at: faults.cut(),
            cut: None,
        }
    }
}

impl Sink for FaultySink<'_> {
    fn framing(&mut self, raw: &[u8]) -> io::Result<()> {
        self.client.write_all(raw)
    }

    fn data(&mut self, data: &mut [u8]) -> io::Result<()> {
        let start = self.offset;
        let end = start + data.len() as u64;
        if let Some(at) = self.flip_at.filter(|at| (start..end).contains(at)) {
            data[(at - start) as usize] ^= 0xff;
        }
        self.offset = end;
        match self.cut_at.filter(|&(at, _)| end > at) {
            Some((at, cut)) => {
                self.client.write_all(&data[..(at - start) as usize])?;
                self.cut = Some(cut);
                Err(io::Error::other("response body cut by a fault"))
            }
            None => self.client.write_all(data),
        }
    }
}
