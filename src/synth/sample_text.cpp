// Built-in English sample text for the synthetic tokenizer (tokenizer_gen.h): the BPE merges of
// every synthetic vocabulary are learned from it, and the routing measurement encodes a prompt taken
// from it. Original prose written for ktier; ~18 KB, which supports about 3,300 merges with the
// synth pre-splitter. Changing a single byte changes every synthetic vocabulary, so treat it as
// frozen data.
#include "synth/tokenizer_gen.h"

namespace ktier::synth {

std::string_view sample_text() {
  static constexpr std::string_view kText = R"SAMPLE(
The lighthouse keeper woke before dawn, as he had done every morning for thirty-one years. He climbed the spiral staircase, counted the one hundred and twelve steps out of habit, and checked the lamp, the lens, the clockwork and the log book. Outside, the sea was grey and restless; gulls circled the rocks and a fishing boat was already heading north toward the banks.

Weather reports in those days came by radio twice a day. The keeper wrote down the pressure, the wind direction, the visibility and the height of the swell, then compared them with his own barometer. When the numbers disagreed he trusted the instrument on the wall, because it had never once been wrong about a storm.

A good recipe is a small program that people run in their kitchens. Start with two cups of flour, a teaspoon of salt and a spoonful of sugar. Warm a glass of water until it feels comfortable on the wrist, stir in the yeast and wait ten minutes for foam. Mix everything, knead the dough for eight minutes, cover it with a damp towel and let it rise in a warm place. Bake at two hundred and twenty degrees until the crust is golden and the loaf sounds hollow when you tap the bottom.

Cooking rewards patience more than talent. Onions need time to soften; garlic burns quickly; tomatoes become sweeter after a long simmer. Taste often, season gradually and write down what worked, because memory is a poor notebook.

Computers store numbers as patterns of bits. An integer might use thirty-two or sixty-four of them, while a floating-point value splits its bits into a sign, an exponent and a fraction. The exponent decides how large the number is, and the fraction decides how precise it is. Reducing the number of bits makes models smaller and faster, but every rounding step loses a little information, so engineers measure the error carefully before they trust a compressed format.

A matrix multiplication is a long list of multiplications and additions. The order in which the additions happen matters, because floating-point addition is not associative: adding a tiny value to a huge one and then subtracting the huge one again does not always give the tiny value back. Careful libraries fix the order of every reduction so that results are identical from one run to the next.

Memory is organised in tiers. Registers are the fastest and smallest; caches sit between the processor and main memory; solid-state drives hold far more data but respond much more slowly. A program that reads data in large sequential blocks runs many times faster than one that jumps around randomly, and a scheduler that predicts what will be needed next can hide most of the waiting.

History is full of journeys that changed how people saw the world. Merchants crossed deserts with caravans of camels, carrying silk, spices, paper and ideas. Sailors learned to read the stars, the currents and the colour of the water. Maps improved slowly, one coastline at a time, and each new edition corrected mistakes that earlier travellers had made.

In the village market on Saturday mornings you could buy apples, pears, cherries, plums, carrots, potatoes, cabbages, fresh bread, cheese, honey, eggs and flowers. The baker arrived first, the fishmonger last. Children ran between the stalls while their parents argued politely about prices, and an old man played the accordion near the fountain.

Mathematics describes patterns. A prime number has exactly two divisors; a triangle's angles add up to one hundred and eighty degrees; the area of a circle grows with the square of its radius. Probability measures uncertainty: if you toss a fair coin ten times, five heads is the most likely result, yet it happens less than a quarter of the time.

The library opened at nine o'clock. Students filled the reading room, whispering over textbooks about chemistry, biology, economics, philosophy and engineering. A librarian pushed a trolley of returned books along the shelves, placing each volume back in its correct position according to the catalogue number printed on its spine.

Mountains shape the weather around them. Moist air rises over the slopes, cools and releases rain on the windward side, while the valleys beyond stay dry. Glaciers carve deep valleys over thousands of years, rivers carry sediment down to the plains, and forests change from oak and beech at lower altitudes to pine and spruce higher up.

Good software is written for readers as much as for machines. Names should say what things are; functions should do one thing; comments should explain why a decision was made rather than repeat what the code already says. Tests describe the behaviour that must never change, and they make it safe for someone else to improve the program next year.

When the train left the station it was raining heavily. Passengers shook their umbrellas, found their seats and opened newspapers, laptops and paperback novels. The conductor checked tickets, announced the next stops and reminded everyone that the restaurant car would close at eight. Through the window, towns and fields went by in a blur of lights.

Music theory explains why some combinations of notes sound stable and others sound tense. A major chord feels bright, a minor chord feels darker, and a dominant seventh wants to resolve. Rhythm organises time into beats and bars; melody moves through a scale; harmony supports it from below. Composers break these rules deliberately once they understand them.

The garden needed work after the winter. Dead branches had to be pruned, the soil turned and fertilised, and the seedlings planted in straight rows: beans, peas, lettuce, spinach, radishes, courgettes and sunflowers. Every evening the gardener watered them by hand and checked the leaves for snails, aphids and the first signs of mildew.

Astronomers measure distances in light years. The nearest star beyond the sun is a little more than four light years away, and our galaxy contains hundreds of billions of stars. Telescopes collect faint light over long exposures; spectrographs split it into colours that reveal temperature, composition and motion. Every photon that reaches a detector has travelled an enormous distance.

Language models read text as sequences of tokens. A tokenizer splits words into frequent pieces, so common words become single tokens while rare words are spelled out in several smaller fragments. The model predicts the next token from the previous ones, one step at a time, and a sampler chooses which candidate to emit. Special tokens mark the beginning of a message, the end of a turn, or a separator between fields.

Healthy habits are simple to describe and difficult to keep: sleep enough, walk every day, drink water, eat vegetables, and spend time with friends. Doctors recommend regular checkups because many problems are easier to treat when they are discovered early. Exercise improves mood as well as strength, and even a short walk after lunch makes a difference.

The old bridge across the river was built from stone in the eighteenth century. Its seven arches have survived floods, wars and heavy lorries, although engineers now inspect it every spring. Cracks are measured with gauges, loose mortar is replaced, and the traffic is limited to vehicles lighter than twelve tonnes.

Economics studies how people make choices when resources are limited. Prices carry information about scarcity; markets coordinate millions of independent decisions; governments collect taxes, build infrastructure and regulate monopolies. Inflation erodes savings, unemployment wastes talent, and productivity growth is the main reason living standards rise over decades.

A chess game begins quietly. Each side develops knights and bishops, castles the king into safety and fights for the centre. The middle game is full of tactics: forks, pins, skewers and discovered attacks. In the endgame every tempo counts, kings become active pieces, and a single passed pawn can decide the result.

Photography depends on three settings: aperture, shutter speed and sensitivity. A wide aperture blurs the background; a fast shutter freezes motion; high sensitivity brightens a dark scene at the cost of noise. Light is everything, which is why photographers love the soft, warm hour just after sunrise and just before sunset.

Volunteers cleaned the beach on Sunday. They collected plastic bottles, fishing nets, bottle caps, cigarette filters, shoes, ropes and broken toys, sorted everything into bags and weighed the total: four hundred and sixty kilograms from a single kilometre of sand. The council promised new bins and a campaign to reduce waste.

Chemistry explains why iron rusts, why bread rises and why batteries store energy. Atoms share or exchange electrons to form bonds; reactions release or absorb heat; catalysts speed them up without being consumed. Laboratory work requires goggles, gloves, clean glassware, precise balances and a notebook in which every observation is recorded immediately.

Translating a poem is harder than translating a manual. Words carry sounds, rhythms and associations that rarely survive the crossing into another language. A translator chooses which qualities to keep: the meaning, the rhyme, the metre or the mood, and accepts that something will be lost.

The hospital night shift was quiet until three in the morning, when an ambulance arrived with two patients from a road accident. Nurses prepared the emergency room, a surgeon was called from home, and the laboratory processed blood samples within minutes. By sunrise both patients were stable and the team gathered for coffee.

Biology is the study of living systems. Cells divide, grow and specialise; genes encode proteins; enzymes regulate metabolism; ecosystems balance predators and prey. Evolution explains the variety of life through variation, inheritance and selection acting over countless generations.

Airports never really sleep. Cleaning crews polish the floors, mechanics inspect engines, caterers load trolleys and baggage handlers sort suitcases by destination. At dawn the first departures board fills with cities: Lisbon, Oslo, Nairobi, Tokyo, Montreal, Santiago, Cairo and Melbourne.

Reading aloud to children builds vocabulary, attention and imagination. Picture books introduce rhyme and repetition; longer stories teach patience and empathy. Questions such as what do you think will happen next, or why did the fox do that, turn listening into thinking.

Electric grids must balance supply and demand every second. Power stations, wind farms and solar panels feed energy into the network while factories, homes and trains draw it out. Operators forecast consumption, schedule reserves and store surplus energy in batteries or pumped reservoirs for the evening peak.

The detective examined the room slowly: an overturned chair, a cold cup of tea, a window left open by exactly five centimetres, and muddy footprints that stopped halfway across the carpet. Nothing had been stolen, which was the strangest detail of all.

Volcanoes form where molten rock rises through the crust. Some erupt explosively, throwing ash high into the atmosphere; others release rivers of lava that flow for kilometres. Scientists monitor earthquakes, gas emissions and ground deformation to warn nearby communities before an eruption.

Spreadsheets turned accountants into programmers without anyone noticing. Cells hold numbers, formulas combine them, and charts summarise months of transactions in a single picture. A misplaced reference can still ruin a budget, so careful users check totals twice and protect important columns.

Tea ceremonies, coffee houses and neighbourhood cafes all serve the same purpose: they give people a reason to sit together and talk. Recipes differ from country to country, with milk, sugar, cardamom, lemon, mint or nothing at all, but the conversation is always the main ingredient.

Firefighters train constantly. They practise climbing ladders, handling hoses, searching smoke-filled rooms and giving first aid. Their equipment is checked every morning, their trucks are washed after every call, and their response time is measured in seconds rather than minutes.

Storytellers have always known that conflict drives a plot. A hero wants something, an obstacle stands in the way, and the struggle reveals character. Settings, dialogue and description matter, but readers keep turning pages because they need to know what happens next.

Numbers appear everywhere in daily life: 7 days in a week, 12 months in a year, 24 hours in a day, 60 minutes in an hour, 365 days in most years, 100 centimetres in a metre, 1000 grams in a kilogram and 1024 bytes in a kibibyte. Prices like 3.99 or 249.50 are designed to feel smaller than they are.

Penguins huddle together through the antarctic winter, rotating slowly so that every bird spends some time in the sheltered middle. Males balance a single egg on their feet for about two months, fasting the whole time, while females travel to the ocean to feed and return with food for the newly hatched chick.

Carpentry teaches humility. Wood moves with humidity, splits along its grain and hides knots beneath smooth surfaces. A craftsman measures twice, sharpens chisels until they shave hair, glues joints under clamps overnight, and finishes tabletops with oil, wax or varnish depending on how the furniture will be used.

Bicycles are remarkably efficient machines. A rider converts food into motion with less energy per kilometre than a walker, and a well maintained chain, properly inflated tyres and adjusted brakes make every journey safer. Cities that build protected lanes discover that cycling becomes ordinary transport rather than sport.

The orchestra tuned while the audience settled. Violins, violas, cellos and double basses filled the front; flutes, oboes, clarinets and bassoons sat behind them; trumpets, horns, trombones, a tuba, timpani and percussion occupied the back rows. The conductor raised her baton, and the hall fell silent.

Quantum mechanics replaced certainty with probability. Particles behave like waves, measurements disturb what they observe, and entangled pairs share correlations that no classical explanation can reproduce. Despite its strangeness, the theory underlies lasers, transistors, magnetic resonance imaging and atomic clocks.

Archaeologists excavate carefully, layer by layer, recording the position of every fragment. Pottery shards reveal trade routes, charred seeds reveal diets, and skeletons reveal diseases, injuries and ages at death. Radiocarbon dating, tree rings and coins help establish when each layer was deposited.

Negotiation works best when both parties understand their alternatives. Prepare thoroughly, listen more than you speak, separate people from problems, and look for options that enlarge the pie before dividing it. Agreements that feel fair tend to last; agreements extracted by pressure tend to unravel.

Rivers have personalities. Some meander lazily across floodplains, forming oxbow lakes and wetlands full of herons; others rush through gorges, foaming over boulders and waterfalls. Dams tame them for irrigation and electricity, yet fish ladders, sediment flushing and seasonal releases try to keep ecosystems alive.

Typography quietly guides readers. Serif fonts suit long printed passages, sans serif fonts suit screens and signage, and generous margins, consistent spacing and clear hierarchy make documents pleasant. Kerning adjusts the gaps between particular letter pairs, while leading controls the distance between lines.

Submarines navigate without seeing. Sonar operators listen to propellers, whales and shifting currents; navigators combine gyroscopes, accelerometers and occasional satellite fixes. Pressure increases by roughly one atmosphere every ten metres, so hulls are built from thick steel or titanium.

The marathon started at seven. Thousands of runners jogged in place, adjusted watches and sipped electrolyte drinks. Spectators lined the boulevard with banners and bells; volunteers handed out sponges and bananas; paramedics waited near the finish. The winner crossed the line in just over two hours, while many others walked the last kilometres proudly.

Insurance spreads risk across many people. Each policyholder pays a premium, actuaries estimate claim frequencies and severities, and reserves cover unexpected catastrophes. Fraud, moral hazard and adverse selection complicate the arithmetic, which is why contracts contain deductibles, exclusions and waiting periods.

Cartographers decide what to leave out. A subway diagram straightens tunnels and equalises distances; a hiking map shows contour lines, springs and shelters; a nautical chart marks depths, wrecks and buoys. Every projection distorts something, whether area, shape, direction or distance.

Beekeepers inspect hives every week during summer. They look for the queen, count frames of brood, check honey stores and watch for varroa mites. Smoke calms the colony, a veil protects the face, and patience prevents stings. In autumn they harvest surplus honey, leaving enough for the bees to survive until spring.

Democracy depends on institutions that outlast individual leaders: independent courts, free elections, a professional civil service, a curious press and citizens willing to participate. Constitutions describe these arrangements on paper, but habits of tolerance and compromise keep them functioning.

Glassblowers gather molten glass on a hollow pipe, blow a bubble, shape it with wooden paddles and wet newspaper, reheat it in the glory hole and repeat. Colour comes from metal oxides: cobalt for blue, copper for turquoise, gold for ruby, manganese for purple. Finished pieces cool slowly in an annealing oven overnight.

Pilots follow checklists for everything, from engine start to landing, because memory fails under stress. Before takeoff they verify flaps, trim, fuel, instruments and clearances. During cruise they monitor weather, traffic and systems; during approach they configure the aircraft step by step and brief the missed approach procedure.
)SAMPLE";
  return kText;
}

std::string_view sample_prompt() {
  // Long enough (~90 tokens with the demo vocabulary) that expert-use counts over top-k picks
  // say something about the routers, short enough to stay cheap at K3 widths.
  return "The lighthouse keeper checked the lamp, the lens and the clockwork before the storm. "
         "Weather reports came by radio twice a day; he wrote down the pressure, the wind and the "
         "swell, then compared them with his own barometer. In the village market you could buy "
         "apples, bread, cheese and honey, while an old man played the accordion near the fountain.";
}

}  // namespace ktier::synth
