"""Hand-written prompts for the "write" task (open-ended writing).

Read by build_prompts.py. Each category is a list of prompt strings.
"""

STORIES = [
    "Write a short story (about 200 words) about a lighthouse keeper who receives a letter addressed to someone who died fifty years ago.",
    "Write a very short story in which a robot vacuum cleaner slowly realises that the family cat is its only friend.",
    'Write a short story that begins with the sentence: "The bakery had been closed for ten years, but every morning the smell of bread still drifted out of it."',
    "Write a 150-word science fiction story set on a generation ship, told from the point of view of a child who has never seen a planet.",
    "Write a short mystery story in which the detective solves the case because of a detail in a grocery list.",
    "Write a short, funny story about a wizard whose spells only work if he says them in rhyme, on a day when he has a terrible cold.",
    "Write a short story about two strangers who share an umbrella at a bus stop and discover they grew up on the same street.",
    "Write a fable about a tortoise who opens a café, ending with a one-line moral.",
    "Write a short story told entirely through five text messages between a grandmother and her grandson.",
    "Write a ghost story for young children that is spooky but ends warmly, in under 200 words.",
    "Write a short story about a translator at a peace negotiation who notices that one word has been mistranslated on purpose.",
    "Write a 100-word piece of flash fiction about the last day of summer, set in a small seaside town.",
    "Write a short story in which a retired astronaut teaches a night class on gardening.",
    "Write the opening paragraph of a fantasy novel about a city built on the back of a sleeping giant.",
    "Write a short story about a chess player who realises, mid-game, that her opponent is letting her win.",
    "Write a short story about a mapmaker who is hired to map a forest that changes shape every night.",
    "Write a short adventure story about three friends who follow a river by canoe to find where a message in a bottle came from.",
    "Write a short story about a street musician who plays the same song every day at 5 p.m., and the one day he doesn't.",
]

EMAILS = [
    "Write a polite email to a landlord asking for a leaking kitchen tap to be repaired, mentioning that it has been leaking for two weeks.",
    "Write an email to a colleague declining an invitation to join a new project because of current workload, while staying positive about future collaboration.",
    "Write a short email to a customer apologising that their order will arrive five days late, and offering a 15% discount on their next purchase.",
    "Write an email to a former teacher thanking them for their influence, ten years after graduating.",
    "Write a professional email requesting a meeting with a potential client to demo an inventory-tracking app, proposing three time slots.",
    "Write an email to your team announcing that the office will be closed on Friday for a deep clean, and explaining how to work remotely that day.",
    "Write a friendly follow-up email to a recruiter after a job interview for a data analyst position, one week with no news.",
    "Write an email to a neighbour asking them to water your plants while you are away for ten days, with clear but brief instructions.",
    "Write an email to a software vendor reporting that their export feature produces corrupted CSV files, including the steps to reproduce the problem.",
    "Write an email inviting parents to a school science fair, including the date, the time, and a request for volunteers to help set up.",
    "Write a tactful email to a client explaining that the requested design changes are outside the agreed scope and will cost extra.",
    "Write an email to a gym cancelling a membership, citing a move to another city, and asking for written confirmation.",
    "Write a short welcome email to a new employee who is joining the support team on Monday, covering what to bring and who to ask for.",
    "Write an email to a conference organiser asking whether the talk recordings will be published and whether there are student discounts.",
    "Write an email to a friend you have not spoken to in a year, reconnecting without making it awkward.",
    "Write an email to customers announcing a price increase for a coffee subscription, explaining the reasons honestly and briefly.",
]

PRODUCTS = [
    "Write a product description (about 100 words) for a solar-powered phone charger aimed at hikers.",
    "Write a product description for a handmade ceramic mug with a speckled glaze, for an online craft shop.",
    "Write a short, persuasive product description for a noise-cancelling sleep mask with built-in headphones.",
    "Write an app store description for a habit-tracking app that rewards streaks with a growing virtual garden.",
    "Write a product description for a mechanical keyboard with hot-swappable switches, aimed at programmers.",
    "Write a product description for a refillable, plastic-free shampoo bar, in a warm and playful tone.",
    "Write a product listing for a second-hand road bike in good condition, including an honest note about a scratch on the frame.",
    "Write a product description for a board game about running a chaotic medieval bakery, for two to five players.",
    "Write a menu description for a seasonal pumpkin and sage ravioli dish at a small Italian restaurant.",
    "Write a product description for an ergonomic office chair, focusing on the benefits rather than the technical specifications.",
    "Write a listing for a cosy one-bedroom holiday cottage near a lake, as it might appear on a rental website.",
    "Write a product description for a smart water bottle that reminds its owner to drink, without sounding gimmicky.",
    "Write a short description of a beginner's watercolour painting kit, suitable as a gift for an adult who has never painted.",
    "Write a product description for a pair of waterproof trail-running shoes, in fewer than 80 words.",
]

POEMS = [
    "Write a haiku sequence of three haiku about a city waking up in the rain.",
    "Write a short poem about the sound of a kettle, in the style of a lullaby.",
    "Write a sonnet about learning to program, with the volta where the code finally compiles.",
    "Write a limerick about a cat who learns to use the television remote.",
    "Write a free-verse poem about the first morning after moving to a new country.",
    "Write a poem of four rhyming quatrains about autumn leaves, written for children.",
    "Write a short poem from the point of view of an old oak tree watching a village change over a century.",
    "Write a humorous poem about a printer that only jams when someone is in a hurry.",
    "Write an ode to a bicycle, in about twelve lines.",
    'Write a short poem about the moon that does not use the words "silver", "glow" or "night".',
    "Write a poem about a grandmother's recipe book, with the handwriting as a central image.",
    "Write an acrostic poem on the word OCEAN.",
    "Write a short poem about the last train home, using at least three images of light.",
    "Write a poem in two stanzas about a lost glove, the first from the owner's point of view and the second from the glove's.",
]

DIALOGUES = [
    "Write a dialogue between a nervous first-time flyer and a calm flight attendant during take-off.",
    "Write a short dialogue between a customer and a bookshop owner in which the customer can only remember that the book's cover was blue.",
    "Write a dialogue in which two siblings argue about who should get the last slice of cake and end up agreeing on a clever compromise.",
    "Write a dialogue between a junior developer and a senior developer during a code review, where the senior gives kind but specific feedback.",
    "Write a dialogue between a time traveller from 1850 and a modern teenager trying to explain what a smartphone is.",
    "Write a short scene of dialogue between two astronauts on the Moon who realise they have forgotten something important.",
    "Write a dialogue between a doctor and a patient in which the doctor explains, without jargon, why antibiotics will not help a cold.",
    "Write a dialogue between a detective and a suspect in which the suspect's alibi slowly falls apart.",
    "Write a dialogue between a dog and a cat discussing why humans go to work.",
    "Write a dialogue between a manager and an employee asking for a raise, in which both sides are reasonable.",
    "Write a dialogue between a tourist asking for directions and a local who gives them through landmarks instead of street names.",
    "Write a short radio-play scene in which a farmer and a weather forecaster argue about whether it will rain tomorrow.",
]

ADVICE = [
    "Give practical advice to someone who is starting their first job next week and feels anxious about it.",
    "Give advice to a university student on how to prepare for exams when they have only one week left.",
    "Write a short list of tips for keeping houseplants alive in a dark apartment.",
    "Give advice to a new manager on how to run their first one-on-one meetings with their team.",
    "Give advice to someone who wants to start running but has never exercised regularly.",
    "Give advice to a person who keeps procrastinating on a big personal project, with three concrete techniques.",
    "Give advice to a first-time traveller visiting a country where they do not speak the language.",
    "Give advice on how to give constructive feedback to a friend who has asked for your opinion on their novel.",
    "Give advice to a small café owner on how to attract more customers on weekday afternoons, on a tiny budget.",
    "Give advice to a parent whose teenager spends too much time on their phone, without suggesting a total ban.",
    "Give advice to someone preparing to speak in public for the first time at a friend's wedding.",
    "Give advice to a software developer who wants to contribute to an open-source project for the first time.",
    "Give advice to someone moving in with a flatmate for the first time about avoiding common conflicts.",
    "Give advice on how to write a clear bug report, as if for a new member of a QA team.",
]

OPINIONS = [
    "Write a short opinion paragraph arguing that cities should make public transport free.",
    "Write a paragraph arguing against homework for primary-school children, and then a paragraph arguing for it.",
    "Write a short opinion piece on whether museums should return artefacts to their countries of origin.",
    "Write an opinion paragraph on whether a four-day working week would be good for most companies.",
    "Write a persuasive paragraph encouraging people to learn a musical instrument as adults.",
    "Write a balanced opinion paragraph on whether self-driving cars should be allowed in city centres.",
    "Write an opinion paragraph arguing that every programmer should learn some assembly language.",
    "Write a short op-ed arguing that public libraries are more important today than ever.",
    "Write an opinion paragraph about whether tipping in restaurants should be replaced by higher menu prices.",
    "Write a persuasive paragraph arguing that people should repair electronics instead of replacing them.",
    "Write a short opinion piece about whether schools should teach personal finance as a compulsory subject.",
    "Write an opinion paragraph on whether remote work is better for creativity than working in an office.",
    "Write a short opinion piece arguing for or against banning cars from a historic old town centre.",
    "Write a paragraph giving your view on whether reading fiction makes people more empathetic.",
]

CATEGORIES = [
    ("story", STORIES),
    ("email", EMAILS),
    ("product", PRODUCTS),
    ("poem", POEMS),
    ("dialogue", DIALOGUES),
    ("advice", ADVICE),
    ("opinion", OPINIONS),
]
