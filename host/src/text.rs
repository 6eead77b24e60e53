//! Small text helpers shared by every stage: bounding what goes into logs, Events and
//! conditions.

/// Cuts `s` to at most `max` bytes (on a character boundary), marking the cut with `…`.
pub fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::truncate;

    #[test]
    fn cuts_on_a_character_boundary_and_marks_the_cut() {
        assert_eq!(truncate("abc".into(), 10), "abc");
        assert_eq!(truncate("abcdef".into(), 3), "abc…");
        assert_eq!(truncate("héllo".into(), 2), "h…");
    }
}
