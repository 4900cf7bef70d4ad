//! The SuperNode loop: register and activate, heartbeat, pull each message and its objects,
//! run it, push the reply and its objects; deactivate and unregister when told to stop.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fedfuse_flower_proto::flwr::proto;

use crate::fleet::{Connection, Fleet, NodeKey};
use crate::objects::{Pulled, RecordDict, deflate};
use crate::{NodeError, Result};

/// Flower's error code for a ClientApp that raised.
pub const CLIENT_APP_RAISED_EXCEPTION: i64 = 2;
/// Flower's error code for a message the node could not get (its objects never came).
pub const MESSAGE_UNAVAILABLE: i64 = 3;
/// Flower's error code for a self-registration the SuperLink does not allow.
const REGISTRATION_DISABLED: i64 = 2001;
/// The SuperLink's node id, the source of instructions.
const SUPERLINK_NODE: u64 = 1;

/// Why a [`Handler`] could not answer an instruction: any error of the application's (a
/// malformed instruction, a failed training step, a message type it does not serve). It
/// travels back to the SuperLink as Flower's error content, its reason the error with its
/// sources.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What a node does with an instruction.
pub trait Handler {
    /// Runs one message (`train`, `evaluate`, `query`, ...) on its content and returns the
    /// reply's content; an `Err` travels back as Flower's error content with its reason.
    fn handle(
        &mut self,
        message_type: &str,
        content: &RecordDict,
    ) -> std::result::Result<RecordDict, HandlerError>;
}

/// An error and its sources, `: `-joined: the reason a failed instruction's reply carries.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        // Errors that print their source already would repeat it.
        if !text.ends_with(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// How the node behaves.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// The SuperLink.
    pub connection: Connection,
    /// Seconds between heartbeats (Flower's default is 30).
    pub heartbeat: Duration,
    /// Pause between polls when there is nothing to do (Flower's SuperNode: 3 s), drawn
    /// from 75% to 125% of it so that many nodes do not poll in step.
    pub poll: Duration,
    /// Longest wait for an object the SuperLink has not received yet (Flower's: 2 hours).
    pub object_wait: Duration,
    /// First and longest pause between pulls of an object not available yet (Flower's: 1 s,
    /// doubling up to 10 s, with jitter).
    pub object_backoff: (Duration, Duration),
    /// Longest pause between reconnection attempts.
    pub max_backoff: Duration,
    /// How long the first contact keeps trying a SuperLink that does not answer yet (one
    /// started a moment before the node needs a second or two to listen).
    pub first_contact_wait: Duration,
}

impl NodeOptions {
    /// Flower's defaults for `connection`.
    pub fn new(connection: Connection) -> Self {
        Self {
            connection,
            heartbeat: Duration::from_secs(30),
            poll: Duration::from_secs(3),
            object_wait: Duration::from_secs(7200),
            object_backoff: (Duration::from_secs(1), Duration::from_secs(10)),
            max_backoff: Duration::from_secs(30),
            first_contact_wait: Duration::from_secs(60),
        }
    }
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A progress line for the person running the node.
pub type Log<'a> = &'a (dyn Fn(&str) + Sync);

/// Draws the pauses of polling and retry loops, so that nodes which started or failed
/// together do not all come back at once. Timing only: nothing a run computes depends on it.
struct Jitter(u64);

impl Jitter {
    fn new() -> Self {
        let mut seed = [0u8; 8];
        // Any seed will do; the clock is the fallback.
        if getrandom::fill(&mut seed).is_err() {
            seed = now_secs().to_bits().to_le_bytes();
        }
        Self(u64::from_le_bytes(seed))
    }

    /// A uniform draw in [0, 1) (SplitMix64).
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `d` scaled by a draw from [lo, hi).
    fn scale(&mut self, d: Duration, (lo, hi): (f64, f64)) -> Duration {
        d.mul_f64(lo + (hi - lo) * self.unit())
    }

    /// A back-off pause: `d` times a draw from [0.5, 1) ("equal jitter").
    fn backoff(&mut self, d: Duration) -> Duration {
        self.scale(d, (0.5, 1.0))
    }

    /// A polling pause: `d` times a draw from [0.75, 1.25), `d` on average.
    fn poll(&mut self, d: Duration) -> Duration {
        self.scale(d, (0.75, 1.25))
    }
}

/// Sleeps up to `d`, waking early when `stop` is set.
fn nap(d: Duration, stop: &AtomicBool) {
    let end = Instant::now() + d;
    while !stop.load(Ordering::Relaxed) {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}

/// The node's session with the SuperLink.
struct Session<'a> {
    fleet: &'a Fleet,
    node: proto::Node,
    self_registered: bool,
}

impl<'a> Session<'a> {
    /// Registers (a self-generated key) and activates the node.
    fn open(fleet: &'a Fleet, self_registered: bool, heartbeat: Duration) -> Result<Self> {
        let public_key = fleet.key().public_pem().to_vec();
        if self_registered {
            let _: proto::RegisterNodeFleetResponse = fleet
                .call(
                    "register-node",
                    &proto::RegisterNodeFleetRequest {
                        public_key: public_key.clone(),
                    },
                )
                .map_err(|e| match e {
                    NodeError::Status {
                        code: Some(REGISTRATION_DISABLED),
                        ..
                    } => NodeError::Refused(
                        "the SuperLink authenticates its nodes (--enable-supernode-auth), so a \
                         node cannot register itself: register the node's public key with \
                         `flwr supernode register KEY.pub <connection>` and start the node with \
                         --auth-key KEY"
                            .into(),
                    ),
                    e => e,
                })?;
        }
        let activated: proto::ActivateNodeResponse = fleet
            .call(
                "activate-node",
                &proto::ActivateNodeRequest {
                    public_key,
                    heartbeat_interval: heartbeat.as_secs_f64(),
                },
            )
            .map_err(|e| match e {
                NodeError::Status { detail, .. } if !self_registered => {
                    NodeError::Refused(format!(
                        "the SuperLink refused this node's key ({detail}): register its public \
                         key with `flwr supernode register KEY.pub <connection>` first"
                    ))
                }
                e => e,
            })?;
        Ok(Self {
            fleet,
            node: proto::Node {
                node_id: activated.node_id,
            },
            self_registered,
        })
    }

    fn close(&self) -> Result<()> {
        let node_id = self.node.node_id;
        let _: proto::DeactivateNodeResponse = self
            .fleet
            .call("deactivate-node", &proto::DeactivateNodeRequest { node_id })?;
        if self.self_registered {
            let _: proto::UnregisterNodeFleetResponse = self.fleet.call(
                "unregister-node",
                &proto::UnregisterNodeFleetRequest { node_id },
            )?;
        }
        Ok(())
    }

    /// Pulls every object of `tree`, waiting for those the SuperLink does not hold yet as
    /// Flower's client does: a pause that doubles from `opts.object_backoff.0` up to its
    /// second value, with jitter, for up to `opts.object_wait` per object and no later than
    /// `expires` (the message's end: no reply is taken after it). A pull whose exchange breaks
    /// off (a connection reset) is tried again the same way, as Flower's SuperNode retries its
    /// pulls: the SuperLink delivers a message only once, so giving up on it mid-pull would
    /// leave the round waiting for a reply that never comes. Every failure to get an object
    /// within the wait is an [`NodeError::Object`], which the caller answers.
    fn pull_objects(
        &self,
        (run_id, tree, expires): (u64, &proto::ObjectTree, Option<Instant>),
        opts: &NodeOptions,
        stop: &AtomicBool,
        (jitter, log): (&mut Jitter, Log<'_>),
    ) -> Result<Pulled> {
        let wait = opts.object_wait;
        let (first, cap) = opts.object_backoff;
        let mut pulled = Pulled::new();
        let mut todo = vec![tree];
        while let Some(t) = todo.pop() {
            todo.extend(t.children.iter());
            let deadline = Instant::now() + wait;
            let deadline = expires.map_or(deadline, |e| deadline.min(e));
            let mut pause = first;
            loop {
                let outcome = self.fleet.call::<_, proto::PullObjectResponse>(
                    "pull-object",
                    &proto::PullObjectRequest {
                        node: Some(self.node),
                        run_id,
                        object_id: t.object_id.clone(),
                    },
                );
                let failure = match outcome {
                    Ok(r) if !r.object_found => {
                        return Err(NodeError::Object(format!(
                            "the SuperLink does not know object {}",
                            t.object_id
                        )));
                    }
                    Ok(r) if r.object_available => {
                        pulled.insert(&t.object_id, r.object_content)?;
                        break;
                    }
                    Ok(_) => None,
                    Err(e) if e.is_transient() => Some(e),
                    Err(e) => return Err(e),
                };
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || stop.load(Ordering::Relaxed) {
                    return Err(NodeError::Object(match failure {
                        Some(e) => format!("object {} could not be pulled ({e})", t.object_id),
                        None => {
                            format!("object {} was not available within {:?}", t.object_id, wait)
                        }
                    }));
                }
                let nap_for = jitter.backoff(pause).min(left);
                if let Some(e) = failure {
                    log(&format!("{e}; pulling again in {nap_for:.1?}"));
                }
                nap(nap_for, stop);
                pause = (pause * 2).min(cap);
            }
        }
        Ok(pulled)
    }

    /// Pulls, runs and answers at most one message; whether there was one. A message whose
    /// objects never come (or cannot be read, or cannot be pulled at all) is answered with
    /// Flower's "message unavailable" error, so that the round counts it as a failure instead
    /// of waiting out its timeout, and is then the loop's error, which backs off.
    fn step(
        &self,
        handler: &mut dyn Handler,
        opts: &NodeOptions,
        stop: &AtomicBool,
        (jitter, log): (&mut Jitter, Log<'_>),
    ) -> Result<bool> {
        let pulled: proto::PullMessagesResponse = self.fleet.call(
            "pull-messages",
            &proto::PullMessagesRequest {
                node: Some(self.node),
                message_ids: Vec::new(),
            },
        )?;
        let (Some(message), Some(tree)) = (
            pulled.messages_list.first(),
            pulled.message_object_trees.first(),
        ) else {
            return Ok(false);
        };
        let meta = message
            .metadata
            .clone()
            .ok_or_else(|| NodeError::Object("a message without metadata".into()))?;
        let content = if tree.object_id != meta.message_id {
            Err(NodeError::Object(format!(
                "message {}: its object tree is rooted at {}",
                meta.message_id, tree.object_id
            )))
        } else {
            // The SuperLink's clock set the TTL; the node's clock judges it, as below. A
            // TTL past what an `Instant` can hold sets no bound.
            let left = meta.created_at + meta.ttl - now_secs();
            let expires = if left > 0.0 {
                Duration::try_from_secs_f64(left)
                    .ok()
                    .and_then(|d| Instant::now().checked_add(d))
            } else {
                Some(Instant::now())
            };
            self.pull_objects(
                (meta.run_id, tree, expires),
                opts,
                stop,
                (&mut *jitter, log),
            )
            .and_then(|objects| Ok(objects.inflate(&meta.message_id)?.1))
        };
        let content = match content {
            Ok(content) => content,
            Err(e) => {
                // Whatever kept the message from the node, the round learns of it now; a
                // SuperLink that refused the pull will likely refuse this too, and says so.
                let reason = match &e {
                    NodeError::Object(reason) => reason.clone(),
                    e => e.to_string(),
                };
                if let Err(e) = self.answer(&meta, Err((MESSAGE_UNAVAILABLE, &reason)), 0.0) {
                    log(&format!("could not report the unavailable message: {e}"));
                }
                return Err(e);
            }
        };
        // The confirmation only lets the SuperLink free the message's objects; the content
        // is in hand, so a failed one is no reason to leave the message unanswered.
        if let Err(e) = self.fleet.call::<_, proto::ConfirmMessageReceivedResponse>(
            "confirm-message-received",
            &proto::ConfirmMessageReceivedRequest {
                node: Some(self.node),
                run_id: meta.run_id,
                message_object_id: meta.message_id.clone(),
            },
        ) {
            log(&format!("going on without confirming the message: {e}"));
        }
        let started = now_secs();
        if meta.created_at + meta.ttl < started {
            log(&format!(
                "dropped {} message {}: its TTL had passed",
                crate::shown(&meta.message_type),
                crate::shown(&meta.message_id)
            ));
            return Ok(true);
        }
        let clock = Instant::now();
        let outcome = handler.handle(&meta.message_type, &content);
        let runtime = clock.elapsed().as_secs_f64();
        match &outcome {
            Ok(reply) => self.answer(&meta, Ok(reply), runtime)?,
            Err(e) => {
                let reason = error_chain(e.as_ref());
                log(&format!(
                    "{} failed: {}",
                    crate::shown(&meta.message_type),
                    crate::shown(&reason)
                ));
                self.answer(&meta, Err((CLIENT_APP_RAISED_EXCEPTION, &reason)), runtime)?;
            }
        }
        if outcome.is_ok() {
            // fedfuse's strategies name the round in the group id; Flower's leave it empty.
            let group = if meta.group_id.is_empty() {
                String::new()
            } else {
                format!(" (group {})", crate::shown(&meta.group_id))
            };
            log(&format!(
                "{}{group} answered in {runtime:.2} s",
                crate::shown(&meta.message_type)
            ));
        }
        Ok(true)
    }

    /// Pushes the reply to `meta`'s message: `content`, or Flower's error with a code and a
    /// reason; then the objects the SuperLink asks for.
    fn answer(
        &self,
        meta: &proto::Metadata,
        content: std::result::Result<&RecordDict, (i64, &str)>,
        runtime: f64,
    ) -> Result<()> {
        let now = now_secs();
        let reply_meta = proto::Metadata {
            run_id: meta.run_id,
            message_id: String::new(),
            src_node_id: self.node.node_id,
            dst_node_id: if meta.src_node_id == 0 {
                SUPERLINK_NODE
            } else {
                meta.src_node_id
            },
            reply_to_message_id: meta.message_id.clone(),
            group_id: meta.group_id.clone(),
            ttl: (meta.ttl - (now - meta.created_at)).max(0.0),
            message_type: meta.message_type.clone(),
            created_at: now,
            src_task_id: None,
            dst_task_id: meta.src_task_id,
        };
        let reply = match content {
            Ok(content) => deflate(reply_meta, Some(content), None),
            Err((code, reason)) => deflate(
                reply_meta,
                None,
                Some(proto::Error {
                    code,
                    reason: reason.to_string(),
                }),
            ),
        };
        let pushed: proto::PushMessagesResponse = self.fleet.call(
            "push-messages",
            &proto::PushMessagesRequest {
                node: Some(self.node),
                messages_list: vec![reply.message.clone()],
                message_object_trees: vec![reply.tree.clone()],
                clientapp_runtime_list: vec![runtime],
            },
        )?;
        for id in &pushed.objects_to_push {
            let content = reply.objects.get(id).ok_or_else(|| {
                NodeError::Object(format!("the SuperLink asked for unknown object {id}"))
            })?;
            let _: proto::PushObjectResponse = self.fleet.call(
                "push-object",
                &proto::PushObjectRequest {
                    node: Some(self.node),
                    run_id: meta.run_id,
                    object_id: id.clone(),
                    object_content: content.clone(),
                    session_id: pushed.session_id.clone(),
                },
            )?;
        }
        Ok(())
    }
}

/// Sends a heartbeat every `interval` until either flag is set; failures are logged (the
/// main loop notices a lost SuperLink on its own).
fn heartbeats(
    fleet: &Fleet,
    node_id: &AtomicU64,
    interval: Duration,
    flags: [&AtomicBool; 2],
    log: Log<'_>,
) {
    let stopped = || flags.iter().any(|f| f.load(Ordering::Relaxed));
    let mut next = Instant::now() + interval;
    while !stopped() {
        if Instant::now() < next {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        next = Instant::now() + interval;
        let request = proto::SendNodeHeartbeatRequest {
            node: Some(proto::Node {
                node_id: node_id.load(Ordering::Relaxed),
            }),
            heartbeat_interval: interval.as_secs_f64(),
        };
        match fleet.call::<_, proto::SendNodeHeartbeatResponse>("send-node-heartbeat", &request) {
            Ok(r) if r.success => {}
            Ok(_) => log("the SuperLink did not accept a heartbeat"),
            Err(e) => log(&format!("heartbeat failed: {e}")),
        }
    }
}

/// A failed first contact, with what to check: the address, the transport, the CA.
fn first_contact(e: NodeError, conn: &Connection) -> NodeError {
    let (rpc, reason) = match e {
        NodeError::Transport { rpc, reason } | NodeError::Unreachable { rpc, reason } => {
            (rpc, reason)
        }
        other => return other,
    };
    let hint = if reason.to_lowercase().contains("certificate") {
        "the SuperLink's TLS certificate was not accepted: --root-certificates must name the CA \
         that signed it, and the certificate must name the address in --superlink"
    } else if conn.insecure {
        "is a SuperLink listening at this address, without TLS? (For a SuperLink with TLS, \
         give --root-certificates instead of --insecure.)"
    } else {
        "is a SuperLink listening at this address, with TLS? (For one without TLS, give \
         --insecure.)"
    };
    NodeError::Transport {
        rpc,
        reason: format!("{reason}; {hint}"),
    }
}

/// The first contact: a SuperLink that does not answer yet is tried again with back-off for
/// up to `opts.first_contact_wait`, as Flower's own SuperNode keeps trying; any other failure
/// (a refused key, a certificate, a wrong protocol) ends it at once. `None` when `stop` was
/// set while waiting.
fn open_first<'f>(
    fleet: &'f Fleet,
    self_registered: bool,
    opts: &NodeOptions,
    stop: &AtomicBool,
    log: Log<'_>,
) -> Result<Option<Session<'f>>> {
    let give_up = Instant::now() + opts.first_contact_wait;
    let mut backoff = Duration::from_millis(500);
    let mut jitter = Jitter::new();
    loop {
        match Session::open(fleet, self_registered, opts.heartbeat) {
            Ok(session) => return Ok(Some(session)),
            Err(NodeError::Unreachable { rpc, reason }) if Instant::now() < give_up => {
                let left = give_up.saturating_duration_since(Instant::now());
                let pause = jitter.backoff(backoff).min(left);
                log(&format!(
                    "no SuperLink answers at {} yet ({rpc}: {reason}); trying again in \
                     {pause:.1?}, for up to {}s more",
                    opts.connection.superlink,
                    left.as_secs()
                ));
                nap(pause, stop);
                if stop.load(Ordering::Relaxed) {
                    return Ok(None);
                }
                backoff = (backoff * 2).min(opts.max_backoff);
            }
            Err(e) => return Err(e),
        }
    }
}

/// How a node stands with the SuperLink after rejoining.
enum Rejoined<'f> {
    /// Activated afresh (registered first where the SuperLink had forgotten the key).
    Anew(Session<'f>),
    /// The SuperLink still holds the node's key, and so the node id bound to it: the node
    /// goes on as it was.
    Kept,
}

/// Whether the SuperLink refused a registration because it holds the key already (Flower:
/// HTTP 412, "Public key already in use.").
fn key_in_use(e: &NodeError) -> bool {
    matches!(e, NodeError::Status { status: 412, detail, .. }
        if detail.to_lowercase().contains("already in use"))
}

/// Joins again after a lost connection: activates; where that is refused, a self-registered
/// node registers its key again, unless the SuperLink still holds it, in which case the
/// node's id is still the key's (Flower refuses to activate a node it counts online).
fn rejoin<'f>(
    fleet: &'f Fleet,
    self_registered: bool,
    heartbeat: Duration,
) -> Result<Rejoined<'f>> {
    match Session::open(fleet, false, heartbeat) {
        Ok(mut s) => {
            s.self_registered = self_registered;
            Ok(Rejoined::Anew(s))
        }
        Err(e) if !self_registered => Err(e),
        Err(_) => match Session::open(fleet, true, heartbeat) {
            Ok(s) => Ok(Rejoined::Anew(s)),
            Err(e) if key_in_use(&e) => Ok(Rejoined::Kept),
            Err(e) => Err(e),
        },
    }
}

/// Runs a node until `stop` is set: joins the SuperLink, answers its messages with
/// `handler`, and leaves cleanly. Lost connections are retried with back-off (the node
/// registers again when the SuperLink has forgotten it); a wrong address, a refused key or a
/// certificate mismatch on first contact is an error.
pub fn run(
    opts: &NodeOptions,
    key: Option<NodeKey>,
    handler: &mut dyn Handler,
    stop: &AtomicBool,
    log: Log<'_>,
) -> Result<()> {
    let self_registered = key.is_none();
    let key = match key {
        Some(k) => k,
        None => NodeKey::generate()?,
    };
    let fleet = Fleet::new(&opts.connection, key)?;
    let Some(mut session) = open_first(&fleet, self_registered, opts, stop, log)
        .map_err(|e| first_contact(e, &opts.connection))?
    else {
        return Ok(());
    };
    log(&format!(
        "joined {} as node {}",
        opts.connection.superlink, session.node.node_id
    ));
    // Heartbeats run beside the work, so a long local step does not make the SuperLink
    // count the node as gone.
    let node_id = AtomicU64::new(session.node.node_id);
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| heartbeats(&fleet, &node_id, opts.heartbeat, [stop, &done], log));
        let mut backoff = Duration::from_secs(1);
        let mut jitter = Jitter::new();
        while !stop.load(Ordering::Relaxed) {
            match session.step(handler, opts, stop, (&mut jitter, log)) {
                Ok(true) => backoff = Duration::from_secs(1),
                Ok(false) => {
                    backoff = Duration::from_secs(1);
                    nap(jitter.poll(opts.poll), stop);
                }
                Err(NodeError::Object(reason)) => {
                    // One bad message: say so and go on with the next, after the same pause
                    // as other failures, so a SuperLink serving it again and again does not
                    // get a tight loop of pulls.
                    let pause = jitter.backoff(backoff);
                    log(&format!(
                        "a message could not be read: {reason}; next poll in {pause:.1?}"
                    ));
                    nap(pause, stop);
                    backoff = (backoff * 2).min(opts.max_backoff);
                }
                Err(e) => {
                    let pause = jitter.backoff(backoff);
                    log(&format!(
                        "lost the SuperLink ({e}); retrying in {pause:.1?}"
                    ));
                    nap(pause, stop);
                    backoff = (backoff * 2).min(opts.max_backoff);
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    // Activate again; a restarted SuperLink that forgot the node gets it
                    // registered again first.
                    match rejoin(&fleet, self_registered, opts.heartbeat) {
                        Ok(Rejoined::Anew(s)) => {
                            session = s;
                            node_id.store(session.node.node_id, Ordering::Relaxed);
                            log(&format!("rejoined as node {}", session.node.node_id));
                        }
                        Ok(Rejoined::Kept) => log(&format!(
                            "the SuperLink still holds this node: going on as node {}",
                            session.node.node_id
                        )),
                        Err(e) => log(&format!("could not rejoin yet: {e}")),
                    }
                }
            }
        }
        done.store(true, Ordering::Relaxed);
    });
    // Told to stop: a SuperLink that is already gone (stopped with the nodes, as the
    // loopback recipes do) has nothing left to tell, so that is no failure of the node.
    match session.close() {
        Ok(()) => log("left the federation"),
        Err(e) => log(&format!(
            "stopped without saying goodbye to the SuperLink ({e})"
        )),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

    use super::*;
    use prost::Message as _;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::sync::atomic::AtomicUsize;
    use std::sync::{Arc, Mutex};

    /// What a fake SuperLink serves and what it saw.
    #[derive(Default)]
    struct Fake {
        /// The message every pull returns (none: nothing to do).
        message: Option<(proto::Message, proto::ObjectTree)>,
        /// Messages served once each, ahead of `message`, as Flower's SuperLink delivers a
        /// message only once.
        queue: Mutex<std::collections::VecDeque<(proto::Message, proto::ObjectTree)>>,
        /// Objects by id; a pull of one is "not available yet" this many times first.
        objects: std::collections::HashMap<String, Vec<u8>>,
        unavailable: AtomicUsize,
        /// The first this many `pull-object` (`pull-messages`) requests have their
        /// connection closed without an answer.
        cut_object_pulls: AtomicUsize,
        cut_message_pulls: AtomicUsize,
        /// Activation after the first is refused, as Flower refuses a node that is online.
        activate_once: bool,
        /// Registration after the first is refused: "Public key already in use".
        key_in_use: bool,
        activations: AtomicUsize,
        registrations: AtomicUsize,
        pulls: AtomicUsize,
        object_pulls: AtomicUsize,
        pushed: Mutex<Vec<proto::Message>>,
    }

    /// Takes one from `n` if it is not zero; whether it did.
    fn take(n: &AtomicUsize) -> bool {
        n.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }

    /// A SuperLink at 127.0.0.1 that lets a node join and serves `fake`.
    fn superlink(fake: Arc<Fake>) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let fake = fake.clone();
                // One thread per connection: the node's heartbeats use their own.
                std::thread::spawn(move || serve(stream, &fake));
            }
        });
        addr
    }

    fn serve(stream: std::net::TcpStream, fake: &Fake) {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut stream = stream;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let rpc = line
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.rsplit('/').next())
                .unwrap_or_default()
                .to_string();
            let mut len = 0;
            loop {
                let mut header = String::new();
                reader.read_line(&mut header).unwrap();
                if header.trim().is_empty() {
                    break;
                }
                if let Some(v) = header.to_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
            }
            let mut body = vec![0; len];
            reader.read_exact(&mut body).unwrap();
            let cut = match rpc.as_str() {
                "pull-object" => take(&fake.cut_object_pulls),
                "pull-messages" => take(&fake.cut_message_pulls),
                _ => false,
            };
            if cut {
                // The exchange breaks off: the request was read, no answer comes.
                let _ = stream.shutdown(std::net::Shutdown::Both);
                return;
            }
            let refusal = match rpc.as_str() {
                "activate-node"
                    if fake.activations.fetch_add(1, Ordering::Relaxed) > 0
                        && fake.activate_once =>
                {
                    Some((
                        400,
                        r#"{"code": 2004, "detail": "Node activation failed."}"#,
                    ))
                }
                "register-node"
                    if fake.registrations.fetch_add(1, Ordering::Relaxed) > 0
                        && fake.key_in_use =>
                {
                    Some((
                        412,
                        r#"{"code": 23, "detail": "Public key already in use."}"#,
                    ))
                }
                _ => None,
            };
            if let Some((status, json)) = refusal {
                let reply = format!(
                    "HTTP/1.1 {status} Refused\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{json}",
                    json.len()
                );
                if stream.write_all(reply.as_bytes()).is_err() {
                    return;
                }
                continue;
            }
            let reply = match rpc.as_str() {
                "activate-node" => proto::ActivateNodeResponse { node_id: 7 }.encode_to_vec(),
                "send-node-heartbeat" => {
                    proto::SendNodeHeartbeatResponse { success: true }.encode_to_vec()
                }
                "pull-messages" => {
                    fake.pulls.fetch_add(1, Ordering::Relaxed);
                    let queued = fake.queue.lock().unwrap().pop_front();
                    let (messages_list, message_object_trees) =
                        match queued.or(fake.message.clone()) {
                            Some((m, t)) => (vec![m], vec![t]),
                            None => (Vec::new(), Vec::new()),
                        };
                    proto::PullMessagesResponse {
                        messages_list,
                        message_object_trees,
                        ..Default::default()
                    }
                    .encode_to_vec()
                }
                "pull-object" => {
                    fake.object_pulls.fetch_add(1, Ordering::Relaxed);
                    let id = proto::PullObjectRequest::decode(&body[..])
                        .unwrap()
                        .object_id;
                    let wait = take(&fake.unavailable);
                    let content = fake.objects.get(&id);
                    proto::PullObjectResponse {
                        object_found: content.is_some(),
                        object_available: content.is_some() && !wait,
                        object_content: if wait {
                            Vec::new()
                        } else {
                            content.cloned().unwrap_or_default()
                        },
                    }
                    .encode_to_vec()
                }
                "push-messages" => {
                    let request = proto::PushMessagesRequest::decode(&body[..]).unwrap();
                    fake.pushed.lock().unwrap().extend(request.messages_list);
                    proto::PushMessagesResponse::default().encode_to_vec()
                }
                // Registration, confirmation, deactivation: empty replies.
                _ => Vec::new(),
            };
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/protobuf\r\nContent-Length: {}\r\n\r\n",
                reply.len()
            );
            if stream.write_all(head.as_bytes()).is_err() || stream.write_all(&reply).is_err() {
                return;
            }
        }
    }

    /// A `train` message of empty content, as a SuperLink holds it.
    fn train_message() -> (
        proto::Message,
        proto::ObjectTree,
        std::collections::HashMap<String, Vec<u8>>,
    ) {
        let meta = proto::Metadata {
            run_id: 1,
            message_type: "train".into(),
            ttl: 3600.0,
            created_at: now_secs(),
            ..Default::default()
        };
        let d = deflate(meta, Some(&RecordDict::default()), None);
        (d.message, d.tree, d.objects)
    }

    struct Echo;

    impl Handler for Echo {
        fn handle(
            &mut self,
            _: &str,
            c: &RecordDict,
        ) -> std::result::Result<RecordDict, HandlerError> {
            Ok(c.clone())
        }
    }

    /// Runs a node against `fake` for `for_ms`; returns its log.
    fn run_for(fake: Arc<Fake>, opts: impl Fn(&mut NodeOptions), for_ms: u64) -> Vec<String> {
        let mut o = NodeOptions::new(Connection {
            superlink: superlink(fake),
            insecure: true,
            root_certificates: None,
        });
        opts(&mut o);
        let stop = AtomicBool::new(false);
        let lines = Mutex::new(Vec::new());
        let log = |line: &str| lines.lock().unwrap().push(line.to_string());
        std::thread::scope(|scope| {
            scope.spawn(|| {
                std::thread::sleep(Duration::from_millis(for_ms));
                stop.store(true, Ordering::Relaxed);
            });
            run(&o, None, &mut Echo, &stop, &log).unwrap();
        });
        lines.into_inner().unwrap()
    }

    #[test]
    fn a_message_it_cannot_read_is_answered_as_unavailable_and_pulled_again_after_a_pause() {
        // Every pull: a message whose object tree is rooted elsewhere.
        let mut message = train_message().0;
        message.metadata.as_mut().unwrap().message_id = "a".into();
        let fake = Arc::new(Fake {
            message: Some((
                message,
                proto::ObjectTree {
                    object_id: "b".into(),
                    children: Vec::new(),
                },
            )),
            ..Fake::default()
        });
        let lines = run_for(fake.clone(), |_| {}, 3500);
        // Pauses of 0.5-1 s, 1-2 s, 2-4 s: at most five pulls in 3.5 s; without them,
        // thousands.
        let n = fake.pulls.load(Ordering::Relaxed);
        assert!((2..=5).contains(&n), "{n} pulls in 3.5 s: {lines:?}");
        assert!(
            lines
                .iter()
                .any(|l| l.contains("could not be read") && l.contains("next poll in")),
            "{lines:?}"
        );
        // Each one was answered, so the round counts a failure instead of waiting.
        let pushed = fake.pushed.lock().unwrap();
        assert_eq!(pushed.len(), n, "{lines:?}");
        let error = pushed[0].error.clone().unwrap();
        assert_eq!(error.code, MESSAGE_UNAVAILABLE);
        assert!(error.reason.contains("rooted at b"), "{}", error.reason);
        assert_eq!(
            pushed[0].metadata.as_ref().unwrap().reply_to_message_id,
            "a"
        );
    }

    #[test]
    fn objects_not_available_yet_are_waited_for_with_a_growing_pause() {
        let (message, tree, objects) = train_message();
        let fake = Arc::new(Fake {
            message: Some((message, tree)),
            objects,
            unavailable: AtomicUsize::new(4),
            ..Fake::default()
        });
        let lines = run_for(
            fake.clone(),
            |o| o.object_backoff = (Duration::from_millis(100), Duration::from_millis(400)),
            1600,
        );
        // Four refusals, then the objects: pauses of at most 0.1 + 0.2 + 0.4 + 0.4 s, at
        // least half that; a 100 ms spin would have pulled far more often in the same time.
        let pushed = fake.pushed.lock().unwrap();
        assert!(!pushed.is_empty(), "{lines:?}");
        assert!(pushed[0].error.is_none(), "{:?}", pushed[0].error);
        assert!(
            lines.iter().any(|l| l.contains("train answered")),
            "{lines:?}"
        );
    }

    #[test]
    fn an_object_that_never_comes_ends_in_an_unavailable_reply_after_the_wait() {
        let (message, tree, objects) = train_message();
        let fake = Arc::new(Fake {
            message: Some((message, tree)),
            objects,
            unavailable: AtomicUsize::new(usize::MAX),
            ..Fake::default()
        });
        let lines = run_for(
            fake.clone(),
            |o| {
                o.object_wait = Duration::from_millis(1500);
                o.object_backoff = (Duration::from_millis(100), Duration::from_millis(400));
            },
            1800,
        );
        // Pauses of at least 50, 100, 200, 200, ... ms: at most 11 pulls in the 1.5 s wait;
        // a fixed 100 ms pause would pull 15 times.
        let pulls = fake.object_pulls.load(Ordering::Relaxed);
        assert!((4..=11).contains(&pulls), "{pulls} object pulls: {lines:?}");
        let pushed = fake.pushed.lock().unwrap();
        let error = pushed.first().and_then(|m| m.error.clone()).unwrap();
        assert_eq!(error.code, MESSAGE_UNAVAILABLE);
        assert!(
            error.reason.contains("not available within"),
            "{}",
            error.reason
        );
    }

    /// A fake that serves `train_message()` once, with its objects.
    fn serving_once(fake: Fake) -> (Arc<Fake>, String) {
        let (message, tree, objects) = train_message();
        let id = tree.object_id.clone();
        let fake = Fake {
            queue: Mutex::new([(message, tree)].into()),
            objects,
            ..fake
        };
        (Arc::new(fake), id)
    }

    #[test]
    fn a_connection_cut_mid_pull_is_retried_and_the_message_answered_with_its_result() {
        // The soak's failure: a reset during pull-object. Flower's SuperLink delivers a
        // message once, so a node that gives up on it can never answer it.
        let (fake, id) = serving_once(Fake {
            cut_object_pulls: AtomicUsize::new(1),
            ..Fake::default()
        });
        let lines = run_for(
            fake.clone(),
            |o| o.object_backoff = (Duration::from_millis(100), Duration::from_millis(400)),
            1500,
        );
        let pushed = fake.pushed.lock().unwrap();
        assert_eq!(pushed.len(), 1, "{lines:?}");
        assert!(pushed[0].error.is_none(), "{:?}", pushed[0].error);
        assert_eq!(pushed[0].metadata.as_ref().unwrap().reply_to_message_id, id);
        assert!(
            lines.iter().any(|l| l.contains("train answered")),
            "{lines:?}"
        );
        // Nothing else went wrong: the session was never given up.
        assert!(!lines.iter().any(|l| l.contains("lost")), "{lines:?}");
    }

    #[test]
    fn a_pull_that_never_recovers_ends_in_an_unavailable_reply() {
        let (fake, id) = serving_once(Fake {
            cut_object_pulls: AtomicUsize::new(usize::MAX),
            ..Fake::default()
        });
        let lines = run_for(
            fake.clone(),
            |o| {
                o.object_wait = Duration::from_millis(1000);
                o.object_backoff = (Duration::from_millis(100), Duration::from_millis(400));
            },
            1800,
        );
        // Pauses of at least 50, 100, 200, 200, ... ms in the 1 s wait: at most 8 tries.
        let pulls = fake.object_pulls.load(Ordering::Relaxed);
        assert!(pulls <= 8, "{pulls} object pulls: {lines:?}");
        let pushed = fake.pushed.lock().unwrap();
        assert_eq!(pushed.len(), 1, "{lines:?}");
        let error = pushed[0].error.clone().unwrap();
        assert_eq!(error.code, MESSAGE_UNAVAILABLE);
        assert!(
            error.reason.contains("could not be pulled"),
            "{}",
            error.reason
        );
        assert_eq!(pushed[0].metadata.as_ref().unwrap().reply_to_message_id, id);
    }

    #[test]
    fn a_node_whose_key_is_in_use_keeps_its_id_and_answers_the_next_message() {
        // The SuperLink still holds the node after a cut pull-messages: activating again is
        // refused (the node is online) and so is registering its key again.
        let (fake, id) = serving_once(Fake {
            cut_message_pulls: AtomicUsize::new(1),
            activate_once: true,
            key_in_use: true,
            ..Fake::default()
        });
        let lines = run_for(fake.clone(), |_| {}, 2500);
        assert_eq!(fake.registrations.load(Ordering::Relaxed), 2, "{lines:?}");
        assert!(
            !lines.iter().any(|l| l.contains("could not rejoin")),
            "{lines:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("still holds") && l.contains("node 7")),
            "{lines:?}"
        );
        let pushed = fake.pushed.lock().unwrap();
        assert_eq!(pushed.len(), 1, "{lines:?}");
        assert!(pushed[0].error.is_none(), "{:?}", pushed[0].error);
        let meta = pushed[0].metadata.as_ref().unwrap();
        assert_eq!(
            (meta.src_node_id, meta.reply_to_message_id.as_str()),
            (7, id.as_str())
        );
    }

    #[test]
    fn an_idle_node_polls_at_flowers_cadence_with_jitter() {
        assert_eq!(
            NodeOptions::new(Connection {
                superlink: String::new(),
                insecure: true,
                root_certificates: None,
            })
            .poll,
            Duration::from_secs(3)
        );
        let fake = Arc::new(Fake::default());
        let lines = run_for(fake.clone(), |o| o.poll = Duration::from_millis(200), 2100);
        // Pauses of 150-250 ms: 9 to 15 pulls in 2.1 s (a pull itself takes about 1 ms).
        let n = fake.pulls.load(Ordering::Relaxed);
        assert!((8..=15).contains(&n), "{n} pulls: {lines:?}");
        let mut j = Jitter(1);
        let draws: Vec<Duration> = (0..1000).map(|_| j.poll(Duration::from_secs(3))).collect();
        assert!(
            draws
                .iter()
                .all(|d| (2.25..3.75).contains(&d.as_secs_f64()))
        );
        let mean = draws.iter().map(Duration::as_secs_f64).sum::<f64>() / 1000.0;
        assert!((mean - 3.0).abs() < 0.05, "{mean}");
    }
}
