/* kumo guest supervisor: entry, descriptor tables, page tables, interrupt stubs.
 *
 * Ring-0 code runs in KVM's instruction emulator on PVM hosts (~1 us per instruction),
 * so everything that can be computed before run time is: the page tables, GDT, TSSs
 * and IDT below are plain data in the image. The IDT gates can be data only because
 * the stubs sit at a fixed address (kernel.ld asserts it), which makes each handler
 * address an assembler constant that can be split into the gate's fields. */

.set STUBS_BASE,    0x100000
.set TSS_BASE,      0x101000
.set TSS_SIZE,      128
.set MAX_CPUS,      64
.set KSTACK_SIZE,   16384
.set SEL_CODE64,    0x08
.set SEL_DATA,      0x10
.set SEL_CODE32,    0x18
.set IDT_VECTORS,   128     /* DEVICE_VECTOR_BASE + kumo_abi::DEVICE_VECTORS */
.set WAKE_VECTOR,   32
.set SPURIOUS_VECTOR, 47
.set DEVICE_VECTOR_BASE, 48     /* kumo_abi::DEVICE_VECTOR_BASE; 80 device vectors */
.set IRQ_RECORD_SIZE, 32
.set AP_TRAMPOLINE, 0x8000
/* The scheduler (kumo_abi::sched, kumo_abi::call::SWITCH). */
.set TICK_VECTOR,   33
.set CALL_SWITCH,   10
.set RQ_CURRENT,    0       /* kumo_abi::sched::RunQueue */
.set RQ_COUNT,      8
.set RQ_SLICE,      16
.set RQ_LEFT,       24
.set RQ_TICKS,      32
.set RQ_SWITCHES,   40
.set RQ_HALTS,      48
.set RQ_TSS_RSP0,   56
.set RQ_TASKS,      64
.set T_KSP,         0       /* kumo_abi::sched::Task, 64 bytes */
.set T_KTOP,        8
.set T_FX,          16
.set T_WORD,        24
.set T_VALUE,       32
.set T_WORD2,       40
.set T_VALUE2,      48
.set T_UNTIL,       56
/* Linux boot protocol (Documentation/arch/x86/boot.rst, zero-page.rst). */
.set LINUX_HEAD_SIZE,   0x1000  /* src/bzimage.rs: the head, then the supervisor's bytes */
.set LINUX_ENTRY_OFFSET, 0x200  /* the 64-bit entry's offset in the protected-mode part */
.set BP_ACPI_RSDP,      0x070   /* boot_params fields */
.set BP_EXT_CMDLINE,    0x0c8
.set BP_E820_ENTRIES,   0x1e8
.set BP_CMDLINE,        0x228
.set BP_E820_TABLE,     0x2d0
.set E820_MAX,          128
.set LINUX_MEMMAP,      0x100   /* offset of the memory map in linux_start_info */
.set START_INFO_MAGIC,  0x336ec578

/* ---- Xen PVH entry note: XEN_ELFNOTE_PHYS32_ENTRY (18). The descriptor is 8 bytes
   (QEMU reads a 64-bit value for ELF64 kernels; Xen and kumo accept 4 or 8). */
.section .note.Xen, "a"
.balign 4
.long 4, 8, 18
.asciz "Xen"
.balign 4
.quad pvh_start32

/* ---- 32-bit entry (BSP from the PVH loader, APs from the trampoline) ---- */
.section .text.boot, "ax"
.code32
.globl pvh_start32
pvh_start32:
    rdtsc
    mov %eax, entry_tsc
    mov %edx, entry_tsc + 4
    xor %esi, %esi                  /* esi = 0: the BSP; ebx = hvm_start_info */
enter_long_mode:
    lgdt gdt_ptr
    mov $0x620, %eax                /* CR4: PAE | OSFXSR | OSXMMEXCPT (SSE for ring 3) */
    mov %eax, %cr4
    mov $pml4, %eax
    mov %eax, %cr3
    mov $0xC0000080, %ecx           /* EFER.LME */
    rdmsr
    or $0x100, %eax
    wrmsr
    mov $0x80010033, %eax           /* CR0: PG | WP | NE | ET | MP | PE (EM clear) */
    mov %eax, %cr0
    ljmp $SEL_CODE64, $long_mode

.code64
long_mode:
    mov $SEL_DATA, %eax
    mov %eax, %ds
    mov %eax, %es
    mov %eax, %ss
    lidt idt_ptr
    test %esi, %esi
    jnz ap_long_mode
    mov $kstacks + KSTACK_SIZE, %esp    /* CPU 0's stack; rsp upper half is 0 */
    mov %ebx, %edi
    call bsp_main
    ud2

ap_long_mode:
    mov $1, %eax                    /* CPUID.1 EBX[31:24]: this CPU's APIC ID */
    cpuid
    shr $24, %ebx
    movzbl apic_to_cpu(%rbx), %edi
    cmp $MAX_CPUS, %edi
    jae park                        /* not in the MADT (or beyond MAX_CPUS): stay off */
    mov %edi, %eax
    shl $14, %eax                   /* KSTACK_SIZE */
    lea kstacks + KSTACK_SIZE(%rax), %rsp
    call ap_main
park:
    cli
    hlt
    jmp park

/* ---- Linux boot protocol entry: the 64-bit entry of kumo's bzImage ----
   src/bzimage.rs builds the bzImage's protected-mode part as: a LINUX_HEAD_SIZE head
   whose offset LINUX_ENTRY_OFFSET holds a copy of this section, the supervisor's file
   bytes (its link addresses from 1 MiB up to kernel_file_end), then the runtime's file
   bytes (linked at USER_IMAGE_BASE). A loader (rust-hypervisor-firmware; Cloud
   Hypervisor- or Firecracker-style direct boot) puts that part at some address L and
   jumps to L + LINUX_ENTRY_OFFSET in 64-bit mode, on its own identity-mapped page
   tables, with rsi = boot_params. This code runs from that copy, so it names itself
   only RIP-relative. It moves both parts to their link addresses, clears their .bss,
   turns boot_params into the hvm_start_info the PVH entry is given (the command line
   and ACPI tables stay where the loader put them), and continues as the PVH entry does
   in long mode. The loader's page tables, zero page and command line must lie outside
   the two destinations, as they do for loaders that keep them below 1 MiB or in their
   own image below L; L must put this code above the supervisor's destination and the
   whole part below the runtime's (else: halt, which kumo reports). */
.section .linux_entry, "ax"
.code64
.globl linux_entry64
linux_entry64:
    jmp 1f
    .ascii "KUMOLNX1"               /* src/bzimage.rs checks these and the two sizes */
    .long kernel_file_size
    .long USER_IMAGE_FILE_SIZE
1:  cli
    cld
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, %r14                  /* the entry TSC, stored once the image is in place */
    mov %rsi, %r15                  /* boot_params */
    lea linux_entry64 - LINUX_ENTRY_OFFSET + LINUX_HEAD_SIZE(%rip), %rbx
    lea linux_entry64(%rip), %rax   /* the copies must not overwrite this code ... */
    cmp $kernel_file_end, %rax
    jb linux_refused
    mov %rbx, %rax                  /* ... nor the runtime's bytes before they are read */
    add $kernel_file_size, %rax
    add $USER_IMAGE_FILE_SIZE, %rax
    cmp $USER_IMAGE_BASE, %rax
    ja linux_refused

    /* rep movsq, then the remaining bytes (each iteration is emulated on PVM hosts). */
.macro copy_bytes
    mov %rcx, %rdx
    shr $3, %rcx
    rep movsq
    mov %edx, %ecx
    and $7, %ecx
    rep movsb
.endm
.macro zero_bytes
    xor %eax, %eax
    mov %rcx, %rdx
    shr $3, %rcx
    rep stosq
    mov %edx, %ecx
    and $7, %ecx
    rep stosb
.endm
    lea kernel_file_size(%rbx), %rsi    /* the runtime, upwards (no overlap: checked) */
    mov $USER_IMAGE_BASE, %edi
    mov $USER_IMAGE_FILE_SIZE, %ecx
    copy_bytes
    mov %rbx, %rsi                  /* the supervisor, downwards (forward copy is safe) */
    mov $0x100000, %edi
    mov $kernel_file_size, %ecx
    copy_bytes
    mov $kernel_bss_start, %edi
    mov $kernel_bss_size, %ecx
    zero_bytes
    mov $user_bss_start, %edi
    mov $user_bss_size, %ecx
    zero_bytes

    mov $linux_start_info, %edi
    movl $START_INFO_MAGIC, (%rdi)
    movl $1, 4(%rdi)                /* version 1: has a memory map */
    movq $0, 8(%rdi)                /* flags, nr_modules */
    movq $0, 16(%rdi)               /* modlist_paddr */
    mov BP_CMDLINE(%r15), %eax
    mov BP_EXT_CMDLINE(%r15), %edx
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, 24(%rdi)              /* cmdline_paddr */
    mov BP_ACPI_RSDP(%r15), %rax
    mov %rax, 32(%rdi)              /* rsdp_paddr (0: the PVH path scans for it) */
    lea LINUX_MEMMAP(%rdi), %rdx
    mov %rdx, 40(%rdi)              /* memmap_paddr */
    movzbl BP_E820_ENTRIES(%r15), %ecx
    mov $E820_MAX, %eax
    cmp %eax, %ecx
    cmova %eax, %ecx
    mov %rcx, 48(%rdi)              /* memmap_entries, reserved */
    lea BP_E820_TABLE(%r15), %rsi   /* e820 entries are 20 bytes, PVH's 24 */
2:  test %ecx, %ecx
    jz 3f
    mov (%rsi), %rax
    mov %rax, (%rdx)
    mov 8(%rsi), %rax
    mov %rax, 8(%rdx)
    mov 16(%rsi), %eax
    mov %rax, 16(%rdx)              /* type, and a zero pad */
    add $20, %rsi
    add $24, %rdx
    dec %ecx
    jmp 2b
3:  mov %r14, entry_tsc
    mov $0x620, %eax                /* the PVH entry's CR4, CR3, CR0 and GDT */
    mov %rax, %cr4
    mov $pml4, %eax
    mov %rax, %cr3
    mov $0x80010033, %eax
    mov %rax, %cr0
    lgdt gdt_ptr
    mov $linux_start_info, %ebx
    xor %esi, %esi                  /* the BSP */
    push $SEL_CODE64
    push $long_mode
    lretq
linux_refused:
    cli
    hlt
    jmp linux_refused

.section .text.boot, "ax"
/* ---- AP real-mode trampoline, copied to AP_TRAMPOLINE (SIPI vector 0x08) ---- */
.code16
.globl ap_trampoline_start, ap_trampoline_end
ap_trampoline_start:
    cli
    mov %cs, %ax
    mov %ax, %ds
    lgdtl tramp_gdt_ptr - ap_trampoline_start
    mov %cr0, %eax
    or $1, %eax
    mov %eax, %cr0
    ljmpl $SEL_CODE32, $ap_protected_mode
.balign 4
tramp_gdt_ptr:
    .short gdt_end - gdt - 1
    .long gdt
ap_trampoline_end:

.code32
ap_protected_mode:
    mov $SEL_DATA, %eax
    mov %eax, %ds
    mov %eax, %es
    mov %eax, %ss
    mov $1, %esi
    jmp enter_long_mode

.code64
/* ---- Trap and interrupt entries ---- */

.macro push_task_rest               /* rax, rcx, rdx are already pushed */
    push %rbx
    push %rsi
    push %rdi
    push %rbp
    push %r8
    push %r9
    push %r10
    push %r11
    push %r12
    push %r13
    push %r14
    push %r15
.endm

/* int3 from ring 3 is the trap call (see kumo_abi::call); from ring 0 it is a fault.
   Ring 3 declares every caller-saved register clobbered, so nothing is saved here. */
breakpoint_entry:
    testb $3, 8(%rsp)
    jz 1f
    cmp $CALL_SWITCH, %rdi
    je switch_call
    sub $8, %rsp                    /* 16-byte alignment for the call */
    call kumo_trap
    add $8, %rsp
    iretq
1:  push $0
    push $3
    jmp fault_entry

/* The wake-up IPI: acknowledge and return (waking from hlt is the whole point). */
wake_entry:
    push %rax
    push %rcx
    push %rdx
    cmpb $0, x2apic_mode
    je 1f
    mov $0x80B, %ecx                /* x2APIC EOI */
    xor %eax, %eax
    xor %edx, %edx
    wrmsr
    jmp 2f
1:  mov $0xFEE000B0, %ecx           /* xAPIC EOI */
    movl $0, (%rcx)
2:  pop %rdx
    pop %rcx
    pop %rax
    iretq

/* A device vector (MSI): record TSC, APIC ID and count in irq_log[vector - 48] for
   ring 3, acknowledge, return. Kept short: every instruction here is emulated on PVM
   hosts, and is part of the interrupt latency ring 3 measures.
   Stack: vector, then the CPU's frame. */
device_entry:
    push %rax
    push %rcx
    push %rdx
    push %rbx
    mov 32(%rsp), %rbx
    shl $5, %rbx                    /* IRQ_RECORD_SIZE */
    lea irq_log - DEVICE_VECTOR_BASE * IRQ_RECORD_SIZE(%rbx), %rbx
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, 8(%rbx)
    cmpb $0, x2apic_mode
    je 1f
    mov $0x802, %ecx                /* x2APIC ID */
    rdmsr
    mov %eax, %eax
    mov %rax, 16(%rbx)
    lock incq (%rbx)
    mov $0x80B, %ecx                /* x2APIC EOI */
    xor %eax, %eax
    xor %edx, %edx
    wrmsr
    jmp 2f
1:  mov $0xFEE00020, %ecx           /* xAPIC ID register, ID in bits 31:24 */
    mov (%rcx), %eax
    shr $24, %eax
    mov %rax, 16(%rbx)
    lock incq (%rbx)
    mov $0xFEE000B0, %ecx           /* xAPIC EOI */
    movl $0, (%rcx)
2:  testb $3, 48(%rsp)             /* from ring 3, with a scheduler of 2+ tasks: the */
    jz 3f                           /* interrupt may have made a waiting task runnable */
    mov 88(%rsp), %rbx              /* (RSP0 + 8: the run queue, or 0) */
    test %rbx, %rbx
    jz 3f
    cmpq $2, RQ_COUNT(%rbx)
    jb 3f
    pop %rbx
    pop %rdx
    pop %rcx
    pop %rax
    add $8, %rsp
    push %rax
    push %rcx
    push %rdx
    push_task_rest
    mov 168(%rsp), %rbx
    xor %r12d, %r12d                /* never halt: the interrupted task is runnable */
    mov $1, %r13d                   /* the others first */
    jmp sched_pick
3:  pop %rbx
    pop %rdx
    pop %rcx
    pop %rax
    add $8, %rsp
    iretq

/* ---- The scheduler: several ring-3 tasks on one CPU (kumo_abi::sched) ----
   A task's kernel stack has its run queue's address in its top qword and the TSS's
   RSP0 16 bytes below the top, so at any entry from ring 3 that address is at RSP0 + 8
   (boot CPU stacks hold 0 there while no scheduler runs). A task switched away from has
   its 15 general registers (kumo_abi::sched::PUSH_ORDER) below the CPU's interrupt
   frame, and its SSE/x87 state in its FXSAVE area. */

/* The tick (LAPIC timer, periodic): acknowledge; from ring 3, count it and, at the end
   of a slice, switch. Few instructions when nothing switches (every one is emulated on
   PVM hosts). Stack: rax, rcx, rdx, then rip, cs, rflags, rsp, ss. */
tick_entry:
    push %rax
    push %rcx
    push %rdx
    mov $0x80B, %ecx                /* x2APIC EOI */
    xor %eax, %eax
    xor %edx, %edx
    wrmsr
    testb $3, 32(%rsp)
    jz 1f                           /* in ring 0 (a halt): that only wakes it */
    mov 72(%rsp), %rax              /* RSP0 + 8 */
    test %rax, %rax
    jz 1f
    incq RQ_TICKS(%rax)
    decq RQ_LEFT(%rax)
    jnz 1f
    mov RQ_SLICE(%rax), %rcx
    mov %rcx, RQ_LEFT(%rax)
    cmpq $2, RQ_COUNT(%rax)
    jb 1f
    push_task_rest
    mov %rax, %rbx
    xor %r12d, %r12d                /* never halt: the interrupted task is runnable */
    mov $1, %r13d                   /* the others first (round robin) */
    jmp sched_pick
1:  pop %rdx
    pop %rcx
    pop %rax
    iretq

/* int3 SWITCH from ring 3 (kumo_abi::call::SWITCH). A caller that waits (wait_word set)
   is looked at first (its condition may already be over), one that yields last. */
switch_call:
    push %rax
    push %rcx
    push %rdx
    push_task_rest
    movq $0, 14*8(%rsp)             /* the caller's rax: the result */
    mov 168(%rsp), %rbx             /* RSP0 + 8 */
    test %rbx, %rbx
    jz sched_resume                 /* no scheduler on this CPU: return at once */
    mov $1, %r12d                   /* may halt */
    xor %r13d, %r13d
    mov RQ_CURRENT(%rbx), %rax
    shl $6, %rax
    cmpq $0, RQ_TASKS + T_WORD(%rbx,%rax)
    sete %r13b                      /* yielding: the others first */

/* rbx = run queue; the current task's registers pushed below its frame; r12 = 1 if the
   CPU may halt when no task is runnable (in SWITCH only); r13 = 1 to start with the
   task after the current one, 0 with the current one. */
sched_pick:
    mov RQ_CURRENT(%rbx), %rsi
    lea -1(%rsi,%r13), %rdi         /* the candidate before the first */
    mov RQ_COUNT(%rbx), %rcx        /* candidates left */
2:  inc %rdi
    cmp RQ_COUNT(%rbx), %rdi
    jb 3f
    sub RQ_COUNT(%rbx), %rdi
3:  mov %rdi, %r9
    shl $6, %r9
    lea RQ_TASKS(%rbx,%r9), %r9
    mov T_WORD(%r9), %r10
    test %r10, %r10
    jz 5f                           /* not waiting: runnable */
    mov (%r10), %eax
    cmp T_VALUE(%r9), %eax
    jne 5f
    mov T_WORD2(%r9), %r10
    mov (%r10), %eax
    cmp T_VALUE2(%r9), %eax
    jne 5f
    mov %rcx, %r8
    rdtsc
    mov %r8, %rcx
    shl $32, %rdx
    or %rdx, %rax
    cmp T_UNTIL(%r9), %rax
    jae 5f
    dec %rcx
    jnz 2b
    test %r12d, %r12d               /* nothing runnable: back to the interrupted task, */
    jz sched_resume
    incq RQ_HALTS(%rbx)             /* or, in SWITCH, halt until an interrupt */
    sti
    hlt
    cli
    xor %r13d, %r13d
    jmp sched_pick
5:  cmp %rsi, %rdi
    je sched_resume
    incq RQ_SWITCHES(%rbx)
    mov %rsi, %r10
    shl $6, %r10
    lea RQ_TASKS(%rbx,%r10), %r10
    mov %rsp, T_KSP(%r10)
    mov T_FX(%r10), %rax
    fxsave64 (%rax)
    mov %rdi, RQ_CURRENT(%rbx)
    mov T_FX(%r9), %rax
    fxrstor64 (%rax)
    mov T_KTOP(%r9), %rax
    mov RQ_TSS_RSP0(%rbx), %rcx
    mov %rax, (%rcx)
    mov T_KSP(%r9), %rsp
sched_resume:
    pop %r15
    pop %r14
    pop %r13
    pop %r12
    pop %r11
    pop %r10
    pop %r9
    pop %r8
    pop %rbp
    pop %rdi
    pop %rsi
    pop %rbx
    pop %rdx
    pop %rcx
    pop %rax
    iretq

/* Stack: vector, error code, then the CPU's frame (rip, cs, rflags, rsp, ss). */
fault_entry:
    mov %rsp, %rdi
    and $-16, %rsp
    call kumo_fault
    ud2

/* ---- IDT stubs, 16 bytes each at STUBS_BASE + 16 * vector ---- */
.section .idt_stubs, "ax"
.set vec, 0
.rept IDT_VECTORS
    .org vec * 16
    .if vec == 3
        jmp breakpoint_entry
    .elseif vec == WAKE_VECTOR
        jmp wake_entry
    .elseif vec == TICK_VECTOR
        jmp tick_entry
    .elseif vec == SPURIOUS_VECTOR
        iretq                       /* spurious: no EOI */
    .elseif vec >= DEVICE_VECTOR_BASE
        push $vec
        jmp device_entry
    .elseif vec == 8 || vec == 10 || vec == 11 || vec == 12 || vec == 13 || vec == 14 || vec == 17 || vec == 21 || vec == 29 || vec == 30
        push $vec                   /* the CPU pushed an error code */
        jmp fault_entry
    .else
        push $0
        push $vec
        jmp fault_entry
    .endif
    .set vec, vec + 1
.endr

/* ---- Task state segments, TSS_SIZE apart at TSS_BASE: RSP0 = the CPU's kernel stack */
.section .tss, "aw"
.set cpu, 0
.rept MAX_CPUS
    .long 0
    .quad kstacks + (cpu + 1) * KSTACK_SIZE - 16   /* RSP0; the top qword: see the scheduler */
    .fill 88, 1, 0                  /* RSP1, RSP2, IST1-7, reserved */
    .short 0
    .short 104                      /* I/O map base beyond the limit: no I/O bitmap */
    .fill TSS_SIZE - 104, 1, 0
    .set cpu, cpu + 1
.endr

.section .data.tables, "aw"
/* ---- Page tables: identity map of [0, 4 GiB) with 2 MiB pages. RAM above 4 GiB is
   mapped by ring 3 (kumo_abi::BootInfo::high_tables), into entries 4.. of the PDPT.
   U/S is set at every level: ring 3 needs its image, stacks, heap, BootInfo and the
   command line, and this guest runs one trusted workload, so separating ring 3 from
   ring-0 memory would buy nothing while finer tables would cost emulated ring-0 work. */
.balign 4096
pml4:
    .quad pdpt + 0x7                /* P | RW | US */
    .fill 511, 8, 0
.globl pdpt
pdpt:
    .quad pd + 0x0000 + 0x7
    .quad pd + 0x1000 + 0x7
    .quad pd + 0x2000 + 0x7
    .quad pd + 0x3000 + 0x7
    .fill 508, 8, 0
pd:
.set page, 0
.rept 2048
    .quad (page << 21) | 0x87       /* P | RW | US | PS (2 MiB) */
    .set page, page + 1
.endr

/* ---- GDT: null, code64, data, code32, user data (0x23), user code64 (0x2B), then one
   16-byte TSS descriptor per CPU at 0x30 + 16 * cpu. */
.balign 16
gdt:
    .quad 0
    .quad 0x00AF9A000000FFFF
    .quad 0x00CF92000000FFFF
    .quad 0x00CF9A000000FFFF
    .quad 0x00CFF2000000FFFF
    .quad 0x00AFFA000000FFFF
.set cpu, 0
.rept MAX_CPUS
    .set tss, TSS_BASE + cpu * TSS_SIZE
    .quad (TSS_SIZE - 1) | ((tss & 0xFFFFFF) << 16) | (0x89 << 40) | ((tss >> 24) << 56)
    .quad tss >> 32
    .set cpu, cpu + 1
.endr
gdt_end:
.balign 8
gdt_ptr:
    .short gdt_end - gdt - 1
    .quad gdt

/* ---- IDT: interrupt gates (IF cleared on entry); only int3 is callable from ring 3. */
.balign 16
.globl idt_ptr
idt:
.set vec, 0
.rept IDT_VECTORS
    .set handler, STUBS_BASE + vec * 16
    .short handler & 0xFFFF
    .short SEL_CODE64
    .byte 0
    .if vec == 3
        .byte 0xEE                  /* present, DPL 3, 64-bit interrupt gate */
    .else
        .byte 0x8E                  /* present, DPL 0, 64-bit interrupt gate */
    .endif
    .short (handler >> 16) & 0xFFFF
    .long handler >> 32
    .long 0
    .set vec, vec + 1
.endr
idt_end:
.balign 8
idt_ptr:
    .short idt_end - idt - 1
    .quad idt

/* Written by the BSP before it starts the APs: APIC ID -> CPU index (0xFF = none). */
.globl apic_to_cpu
apic_to_cpu:
    .fill 256, 1, 0xFF
.globl x2apic_mode
x2apic_mode:
    .byte 0
.balign 8
.globl entry_tsc
entry_tsc:
    .quad 0
/* kumo_abi::IrqRecord per device vector, written by device_entry, read by ring 3. */
.balign 64
.globl irq_log
irq_log:
    .fill (IDT_VECTORS - DEVICE_VECTOR_BASE) * IRQ_RECORD_SIZE, 1, 0

.section .noinit.kstacks, "aw", @nobits
.balign 4096
.globl kstacks
kstacks:
    .skip MAX_CPUS * KSTACK_SIZE

/* The hvm_start_info the Linux entry builds from boot_params: the start info itself,
   then its memory map from LINUX_MEMMAP (24-byte entries, at most E820_MAX). */
.section .noinit.linux_start_info, "aw", @nobits
.balign 4096
linux_start_info:
    .skip 0x100 + E820_MAX * 24
