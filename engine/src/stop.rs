//! Stop strings, checked the same way by every engine: generation stops once the text
//! generated so far contains any of the request's `stop` strings (the token that completed it
//! is still sent, as before).

/// A request's non-empty stop strings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopStrings {
    stops: Vec<String>,
    longest: usize,
}

impl StopStrings {
    pub fn new(stops: Vec<String>) -> Self {
        let stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        StopStrings { stops, longest }
    }

    /// Whether `text`, whose last `piece_len` bytes were just generated, now contains a stop
    /// string. Only the tail that can hold a new match is searched, so a long generation
    /// costs no more per token than a short one.
    pub fn reached(&self, text: &str, piece_len: usize) -> bool {
        if self.stops.is_empty() || piece_len == 0 {
            return false;
        }
        let mut from = text
            .len()
            .saturating_sub(piece_len + self.longest.saturating_sub(1));
        while !text.is_char_boundary(from) {
            from -= 1;
        }
        let tail = &text[from..];
        self.stops.iter().any(|s| tail.contains(s.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_anywhere_in_the_new_text_or_across_pieces() {
        let stop = StopStrings::new(vec!["END".into(), String::new(), "é!".into()]);
        // (text so far, last piece's length, reached)
        for (text, piece, want) in [
            ("hello END", 4, true),
            ("hello ENDING", 7, true),
            ("hello EN", 3, false),
            ("hello END", 1, true),  // the piece "D" completed it
            ("END hello", 6, false), // matched earlier: generation had already stopped
            ("café!", 1, true),
            ("café", 2, false),
            ("", 0, false),
        ] {
            assert_eq!(stop.reached(text, piece), want, "{text:?} +{piece}");
        }
        assert!(!StopStrings::new(vec![String::new()]).reached("anything", 3));
    }
}
