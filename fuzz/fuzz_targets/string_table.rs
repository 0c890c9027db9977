//! String tables (paths, class names): parse, validate, every item.
#![no_main]
use granary_format::{encode_string_table, StringTable};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(t) = StringTable::parse(data, "fuzz") else { return };
    let valid = t.validate().is_ok();
    let items: Vec<_> = t.iter().take(1 << 16).collect();
    let _ = t.get(t.len());
    if valid && t.len() <= 1 << 16 {
        // A valid table is exactly the encoding of its items.
        let items: Vec<&[u8]> = items.into_iter().map(|i| i.unwrap()).collect();
        assert_eq!(encode_string_table(items.iter()), data);
    }
});
