//! Sequence rules for the live stream: every vLLM message carries a number, from 0 at the
//! publisher's start, one more per message. PUB/SUB drops messages when a subscriber falls
//! behind or reconnects, so each number says what to do:
//!
//! - the next one: apply it;
//! - one further on: messages were lost in between; ask the pod's replay socket for them, and
//!   if it cannot give all of them, forget the pod's blocks (never keep a stale owner);
//! - one not above the last seen *live*: the publisher started again (the pod restarted, its
//!   cache is empty): forget its blocks and follow the new numbers;
//! - one not above the last applied, but above the last live one: already applied through a
//!   replay.
//!
//! The first message after this process starts is a gap from 0 when its number is not 0: the
//! pod already holds blocks, which a replay from 0 may still give.

/// What to do with a live message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Apply,
    /// Messages `from..seq` are missing: replay them, then apply this one.
    Gap {
        from: u64,
    },
    /// The publisher restarted: forget everything, then apply this one.
    Restarted,
    /// Applied already (through a replay).
    Duplicate,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sequence {
    /// The last number applied.
    applied: Option<u64>,
    /// The last number received on the live stream.
    live: Option<u64>,
}

impl Sequence {
    /// The next number expected.
    pub fn expected(&self) -> u64 {
        self.applied.map_or(0, |a| a.saturating_add(1))
    }

    /// A live message numbered `seq` arrived.
    pub fn on_live(&mut self, seq: u64) -> Step {
        let restarted = self.live.is_some_and(|l| seq <= l);
        self.live = Some(seq);
        if restarted {
            self.applied = None;
            return Step::Restarted;
        }
        match self.applied {
            Some(a) if seq <= a => Step::Duplicate,
            _ if seq == self.expected() => Step::Apply,
            _ => Step::Gap {
                from: self.expected(),
            },
        }
    }

    /// A message numbered `seq` was applied (live or replayed).
    pub fn applied(&mut self, seq: u64) {
        self.applied = Some(seq);
    }

    /// Everything before `seq` is given up on (after a failed replay, or a restart):
    /// the next message expected is `seq`.
    pub fn resume_at(&mut self, seq: u64) {
        self.applied = seq.checked_sub(1);
    }
}

/// Which replayed messages close a gap: those from `from` on, in order without holes, up to
/// `until` (exclusive; the live message that showed the gap). `None` when the replay does not
/// start at `from` or has a hole before `until`: the gap cannot be closed.
pub fn closes_gap(replayed: &[u64], from: u64, until: u64) -> Option<std::ops::Range<usize>> {
    let start = replayed.iter().position(|&s| s >= from)?;
    let mut want = from;
    let mut end = start;
    for &s in replayed.get(start..)? {
        if s >= until {
            break;
        }
        if s != want {
            return None;
        }
        want += 1;
        end += 1;
    }
    (want == until).then_some(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_gaps_restarts_and_duplicates() {
        let mut s = Sequence::default();
        assert_eq!(s.on_live(0), Step::Apply);
        s.applied(0);
        assert_eq!(s.on_live(1), Step::Apply);
        s.applied(1);
        assert_eq!(s.on_live(4), Step::Gap { from: 2 });
        // the replay applied 2..=5; live 5 then arrives, and 6 follows
        for n in 2..=5 {
            s.applied(n);
        }
        assert_eq!(s.on_live(5), Step::Duplicate);
        assert_eq!(s.on_live(6), Step::Apply);
        s.applied(6);
        // numbers start again: the publisher restarted
        assert_eq!(s.on_live(0), Step::Restarted);
        s.applied(0);
        assert_eq!(s.on_live(1), Step::Apply);
    }

    #[test]
    fn a_late_start_is_a_gap_from_zero() {
        let mut s = Sequence::default();
        assert_eq!(s.on_live(57), Step::Gap { from: 0 });
        // no replay: give up on 0..57 and go on from 57
        s.resume_at(57);
        assert_eq!(s.expected(), 57);
        s.applied(57);
        assert_eq!(s.on_live(58), Step::Apply);
        // a restart at 0 is applied from 0 on
        assert_eq!(s.on_live(0), Step::Restarted);
        assert_eq!(s.expected(), 0);
    }

    #[test]
    fn replays_close_gaps_only_without_holes() {
        assert_eq!(closes_gap(&[0, 1, 2, 3, 4], 2, 4), Some(2..4));
        assert_eq!(closes_gap(&[2, 3], 2, 4), Some(0..2));
        // the buffer no longer holds 2
        assert_eq!(closes_gap(&[3, 4], 2, 4), None);
        // a hole
        assert_eq!(closes_gap(&[2, 4], 2, 5), None);
        // nothing at all
        assert_eq!(closes_gap(&[], 2, 4), None);
        // an empty gap is closed by nothing
        assert_eq!(closes_gap(&[], 3, 3), None);
    }
}
