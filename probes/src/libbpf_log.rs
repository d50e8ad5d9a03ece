//! libbpf's own messages, kept per thread while a family loads, so a failure can say why in
//! the verifier's or libbpf's words instead of a bare errno.

use std::cell::RefCell;

use libbpf_rs::PrintLevel;

thread_local! {
    static CAPTURED: RefCell<Option<String>> = const { RefCell::new(None) };
}

fn capture(_level: PrintLevel, msg: String) {
    CAPTURED.with(|c| {
        if let Some(buf) = c.borrow_mut().as_mut() {
            // A failed load's verifier log can be long; keep its end, which says why.
            if buf.len() > 256 * 1024 {
                buf.drain(..128 * 1024);
            }
            buf.push_str(&msg);
        }
    });
}

/// Routes libbpf's warnings into the calling thread's capture buffer (nothing is printed).
pub fn install() {
    libbpf_rs::set_print(Some((PrintLevel::Warn, capture)));
}

/// Runs `f` with libbpf's messages on this thread captured; returns its result and the text.
pub fn captured<T>(f: impl FnOnce() -> T) -> (T, String) {
    CAPTURED.with(|c| *c.borrow_mut() = Some(String::new()));
    let out = f();
    let text = CAPTURED.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (out, text)
}

/// The lines that say why a load failed: the verifier's last statements before its summary
/// ("R1 unbounded memory access …") and libbpf's own failure lines, at most `max` of them.
pub fn why(log: &str, max: usize) -> Option<String> {
    let lines: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let mut picked: Vec<String> = Vec::new();
    // The verifier's verdict: the lines just before its statistics in the last program log.
    if let Some(end) = lines
        .iter()
        .rposition(|l| l.contains("-- END PROG LOAD LOG --"))
    {
        let stats = [
            "verification time",
            "stack depth",
            "processed ",
            "max_states_per_insn",
        ];
        let body: Vec<&str> = lines[..end]
            .iter()
            .rev()
            .skip_while(|l| stats.iter().any(|s| l.starts_with(s)))
            .take_while(|l| !l.contains("-- BEGIN PROG LOAD LOG --"))
            .take(3)
            .copied()
            .collect();
        picked.extend(body.into_iter().rev().map(|l| l.to_string()));
    }
    // libbpf's own reason ("failed to find kernel BTF type ID of 'x'", "failed to resolve
    // CO-RE relocation …"), minus the generic "failed to load" lines.
    for l in lines.iter().filter(|l| l.starts_with("libbpf: ")) {
        let msg = l.trim_start_matches("libbpf: ");
        // "failed to load: -13", "failed to load object", "failed to load BPF skeleton" only
        // repeat the errno the caller already has.
        let generic = msg.contains("failed to load")
            || msg.contains("-- BEGIN PROG LOAD LOG --")
            || msg.contains("-- END PROG LOAD LOG --");
        if !generic && (msg.contains("fail") || msg.contains("invalid") || msg.contains("unknown"))
        {
            picked.push(msg.to_string());
        }
    }
    picked.dedup();
    if picked.len() > max {
        picked.drain(..picked.len() - max);
    }
    (!picked.is_empty()).then(|| picked.join(" | "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verifier_verdict_is_picked_from_its_log() {
        let log = "libbpf: prog 'irq_handler_exit_btf': BPF program load failed: Permission denied
libbpf: prog 'irq_handler_exit_btf': -- BEGIN PROG LOAD LOG --
0: R1=ctx() R10=fp0
; h->slots[slot]++;
123: (79) r2 = *(u64 *)(r1 +0)
R1 unbounded memory access, make sure to bounds check any such access
verification time 6952 usec
stack depth 16
processed 157 insns (limit 1000000) max_states_per_insn 1 total_states 11
-- END PROG LOAD LOG --
libbpf: prog 'irq_handler_exit_btf': failed to load: -13
libbpf: failed to load object 'irq_bpf'
";
        let why = why(log, 4).unwrap();
        assert!(why.contains("R1 unbounded memory access"), "{why}");
        assert!(why.contains("h->slots[slot]++"), "{why}");
        assert!(why.contains("BPF program load failed"), "{why}");
        assert!(!why.contains("processed 157"), "{why}");
    }

    #[test]
    fn libbpf_reasons_stand_alone() {
        let log = "libbpf: prog 'block_io_start_btf': failed to find kernel BTF type ID of 'block_io_start': -3
libbpf: prog 'block_io_start_btf': failed to prepare load attributes: -3
libbpf: failed to load object 'block_bpf'
";
        let why = why(log, 3).unwrap();
        assert!(
            why.contains("failed to find kernel BTF type ID of 'block_io_start'"),
            "{why}"
        );
        assert_eq!(super::why("nothing useful\n", 3), None);
    }
}
