/*
 * A tiny PVH kernel in the shape third-party ones have: a Xen PHYS32_ENTRY note in its
 * own ELF note section, 32-bit flat entry, code and data in separate sections (so the
 * linker emits more than one PT_LOAD). Assembled as ELF32 (`as --32`, `ld -m elf_i386`)
 * and as ELF64 (`as --64`, `ld -m elf_x86_64`) from this one source by
 * tests/pvh_kernels.rs, with these symbols defined on the command line:
 *   EXIT_STATUS  the value written to the debug-exit port (0xF4) after the banner
 *   HALT         if nonzero, `cli; hlt` forever after the banner instead of exiting
 *                (what a firmware that gives up does)
 */
        .section .note.Xen, "a", @note
        .p2align 2
        .long 4                 /* namesz: "Xen\0" */
        .long 4                 /* descsz */
        .long 18                /* XEN_ELFNOTE_PHYS32_ENTRY */
        .asciz "Xen"
        .long pvh_start

        .text
        .code32
        .globl pvh_start
pvh_start:
        mov $banner, %esi
        mov $0x3f8, %dx
1:      lodsb
        test %al, %al
        jz 2f
        out %al, %dx
        jmp 1b
2:
        .if HALT
3:      cli
        hlt
        jmp 3b
        .else
        mov $EXIT_STATUS, %eax
        out %eax, $0xf4
4:      jmp 4b
        .endif

        .data
banner: .asciz "tiny PVH kernel: hello\nlast words before the end\n"
