//! The ZMQ side: a SUB socket on the pod's publisher, a DEALER on its replay socket when a
//! message is lost. vLLM's replay protocol: send `["", start_seq]` (8 bytes, big-endian), get
//! back every buffered `["", topic, seq, payload]` from that number on, then an end marker
//! whose sequence frame is -1.
//!
//! Connecting waits for the pod (vLLM binds its sockets when its engine starts) and the
//! socket reconnects by itself when the pod restarts; the loop makes a new socket only after a
//! receive error.

use crate::config::Config;
use crate::feed::SharedFeed;
use crate::sequence::{closes_gap, Step};
use crate::wire::{self, Message};
use bytes::Bytes;
use std::time::Duration;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

/// vLLM's end-of-replay marker: sequence -1.
const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// Follows the pod's events forever.
pub async fn follow(config: Config, feed: SharedFeed) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match subscribe(&config).await {
            Ok(mut sub) => {
                backoff = Duration::from_millis(100);
                tracing::info!(events = %config.events, "kv-events: subscribed");
                feed.lock().subscribed = true;
                if let Err(e) = receive(&config, &feed, &mut sub).await {
                    tracing::warn!("kv-events: event stream failed, subscribing again: {e}");
                }
                feed.lock().subscribed = false;
            }
            Err(e) => tracing::warn!(events = %config.events, "kv-events: cannot subscribe: {e}"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn subscribe(config: &Config) -> zeromq::ZmqResult<SubSocket> {
    let mut sub = SubSocket::new();
    if config.bind_events {
        sub.bind(&config.events).await?;
    } else {
        sub.connect(&config.events).await?;
    }
    sub.subscribe(&config.topic).await?;
    Ok(sub)
}

async fn receive(config: &Config, feed: &SharedFeed, sub: &mut SubSocket) -> zeromq::ZmqResult<()> {
    loop {
        let raw = sub.recv().await?;
        let frames: Vec<&[u8]> = raw.iter().map(|b| b.as_ref()).collect();
        let message = match wire::decode(&frames) {
            Ok(m) => m,
            Err(e) => {
                feed.lock().counters.undecodable += 1;
                tracing::warn!("kv-events: message skipped: {e}");
                continue;
            }
        };
        let step = match feed.lock().on_live(message.seq) {
            // a restarted publisher numbers from 0: anything before this one was lost
            Step::Restarted if message.seq > 0 => Step::Gap { from: 0 },
            step => step,
        };
        match step {
            Step::Apply | Step::Restarted => feed.lock().apply(&message),
            Step::Duplicate => {}
            Step::Gap { from } => {
                feed.lock().counters.gaps += 1;
                let replayed = match &config.replay {
                    Some(endpoint) => replay(endpoint, from, config.replay_timeout_ms).await,
                    None => Err("no --replay socket".to_owned()),
                };
                close_gap(feed, from, &message, replayed);
            }
        }
    }
}

/// Applies a replay that closes the gap `from..live.seq` and then `live`; or, when the replay
/// cannot close it, forgets the pod's blocks and goes on from `live`.
fn close_gap(feed: &SharedFeed, from: u64, live: &Message, replayed: Result<Vec<Message>, String>) {
    let mut f = feed.lock();
    let numbers: Vec<u64> = replayed
        .as_ref()
        .map_or_else(|_| Vec::new(), |r| r.iter().map(|m| m.seq).collect());
    match (&replayed, closes_gap(&numbers, from, live.seq)) {
        (Ok(messages), Some(range)) => {
            for m in messages.get(range).unwrap_or_default() {
                f.apply(m);
            }
            f.counters.replayed += 1;
        }
        (outcome, _) => {
            let why = match outcome {
                Err(e) => e.clone(),
                Ok(_) => format!("the replay does not hold every message from {from}"),
            };
            // a pod that just started has nothing to lose: no need to say so
            if from > 0 || live.seq > 0 {
                tracing::warn!(
                    "kv-events: messages {from}..{} lost ({why}): the pod's blocks are forgotten",
                    live.seq
                );
            }
            f.give_up_until(live.seq);
        }
    }
    f.apply(live);
}

/// Asks the pod's replay socket for every buffered message from `from` on.
pub async fn replay(endpoint: &str, from: u64, timeout_ms: u64) -> Result<Vec<Message>, String> {
    let ask = async {
        let mut dealer = DealerSocket::new();
        dealer.connect(endpoint).await.map_err(|e| e.to_string())?;
        let request = ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&from.to_be_bytes()),
        ])
        .map_err(|e| format!("{e:?}"))?;
        dealer.send(request).await.map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        loop {
            let reply = dealer.recv().await.map_err(|e| e.to_string())?;
            // ["", topic, seq, payload]
            let frames: Vec<&[u8]> = reply.iter().skip(1).map(|b| b.as_ref()).collect();
            if frames.get(1).is_some_and(|s| *s == END_SEQ) {
                return Ok(out);
            }
            out.push(wire::decode(&frames).map_err(|e| e.to_string())?);
        }
    };
    match tokio::time::timeout(Duration::from_millis(timeout_ms), ask).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "the replay socket did not finish in {timeout_ms} ms"
        )),
    }
}
